"""deployments: Ray Serve deployments, their versions and state history

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22 10:00:00.000000
"""

from alembic import op
import sqlalchemy as sa


revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None

STATES = ('DEPLOYING', 'HEALTHY', 'UPDATING', 'UNHEALTHY', 'FAILED', 'DELETED')
LIVE = sa.text("state != 'DELETED'")


def upgrade() -> None:
    op.create_table('deployments',
    sa.Column('id', sa.String(length=32), nullable=False),
    sa.Column('project_id', sa.String(length=32), nullable=False),
    sa.Column('name', sa.String(length=63), nullable=False),
    sa.Column('workload', sa.String(length=256), nullable=False),
    sa.Column('route_prefix', sa.String(length=256), nullable=False),
    sa.Column('state', sa.Enum(*STATES, name='deploymentstate', native_enum=False, length=16), nullable=False),
    sa.Column('reason', sa.String(length=64), nullable=False),
    sa.Column('message', sa.Text(), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('live_version', sa.Integer(), nullable=True),
    sa.Column('failed_version', sa.Integer(), nullable=True),
    sa.Column('rollout_started_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('observed', sa.JSON(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('deleted_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['project_id'], ['projects.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('deployments', schema=None) as batch_op:
        batch_op.create_index('ix_deployments_project_created', ['project_id', 'created_at'], unique=False)
        batch_op.create_index('uq_deployments_live_name', ['name'], unique=True, sqlite_where=LIVE, postgresql_where=LIVE)
        batch_op.create_index(
            'uq_deployments_live_route', ['route_prefix'], unique=True, sqlite_where=LIVE, postgresql_where=LIVE
        )

    op.create_table('deployment_versions',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('deployment_id', sa.String(length=32), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('checkpoint_id', sa.Integer(), nullable=True),
    sa.Column('checkpoint_path', sa.String(length=4096), nullable=False),
    sa.Column('job_id', sa.String(length=32), nullable=True),
    sa.Column('checkpoint', sa.JSON(), nullable=False),
    sa.Column('config', sa.JSON(), nullable=False),
    sa.Column('source', sa.JSON(), nullable=False),
    sa.Column('settings', sa.JSON(), nullable=False),
    sa.Column('note', sa.Text(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['checkpoint_id'], ['checkpoints.id'], ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['deployment_id'], ['deployments.id'], ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], ondelete='SET NULL'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('deployment_id', 'version', name='uq_deployment_versions_version')
    )
    with op.batch_alter_table('deployment_versions', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_deployment_versions_deployment_id'), ['deployment_id'], unique=False)

    op.create_table('deployment_events',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('deployment_id', sa.String(length=32), nullable=False),
    sa.Column('from_state', sa.Enum(*STATES, name='deploymentstate', native_enum=False, length=16), nullable=True),
    sa.Column('to_state', sa.Enum(*STATES, name='deploymentstate', native_enum=False, length=16), nullable=False),
    sa.Column('reason', sa.String(length=64), nullable=False),
    sa.Column('message', sa.Text(), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['deployment_id'], ['deployments.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('deployment_events', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_deployment_events_deployment_id'), ['deployment_id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('deployment_events', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_deployment_events_deployment_id'))
    op.drop_table('deployment_events')
    with op.batch_alter_table('deployment_versions', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_deployment_versions_deployment_id'))
    op.drop_table('deployment_versions')
    with op.batch_alter_table('deployments', schema=None) as batch_op:
        batch_op.drop_index('uq_deployments_live_route')
        batch_op.drop_index('uq_deployments_live_name')
        batch_op.drop_index('ix_deployments_project_created')
    op.drop_table('deployments')
