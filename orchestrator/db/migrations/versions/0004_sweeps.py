"""sweeps: hyperparameter sweeps, their state history, trials and trial metrics

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-21 20:30:00.000000
"""

from alembic import op
import sqlalchemy as sa


revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None

JOB_STATES = ('QUEUED', 'STARTING', 'RUNNING', 'RESTARTING', 'CANCELLING', 'SUCCEEDED', 'FAILED', 'CANCELLED')
TRIAL_STATES = ('PENDING', 'RUNNING', 'SUCCEEDED', 'STOPPED', 'FAILED', 'CANCELLED')


def _job_state(name: str, nullable: bool = False) -> sa.Column:
    return sa.Column(name, sa.Enum(*JOB_STATES, name='jobstate', native_enum=False, length=16), nullable=nullable)


def upgrade() -> None:
    op.create_table('sweeps',
    sa.Column('id', sa.String(length=32), nullable=False),
    sa.Column('project_id', sa.String(length=32), nullable=False),
    sa.Column('name', sa.String(length=128), nullable=False),
    sa.Column('workload', sa.String(length=256), nullable=False),
    sa.Column('spec', sa.JSON(), nullable=False),
    sa.Column('priority', sa.Integer(), nullable=False),
    _job_state('state'),
    sa.Column('reason', sa.String(length=64), nullable=False),
    sa.Column('message', sa.Text(), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('token_hash', sa.String(length=64), nullable=False),
    sa.Column('best_trial_id', sa.String(length=32), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['project_id'], ['projects.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('sweeps', schema=None) as batch_op:
        batch_op.create_index('ix_sweeps_project_created', ['project_id', 'created_at'], unique=False)
        batch_op.create_index('ix_sweeps_state_priority', ['state', 'priority', 'created_at'], unique=False)

    op.create_table('sweep_events',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('sweep_id', sa.String(length=32), nullable=False),
    _job_state('from_state', nullable=True),
    _job_state('to_state'),
    sa.Column('reason', sa.String(length=64), nullable=False),
    sa.Column('message', sa.Text(), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['sweep_id'], ['sweeps.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('sweep_events', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_sweep_events_sweep_id'), ['sweep_id'], unique=False)

    op.create_table('trials',
    sa.Column('id', sa.String(length=32), nullable=False),
    sa.Column('sweep_id', sa.String(length=32), nullable=False),
    sa.Column('tune_id', sa.String(length=64), nullable=False),
    sa.Column('number', sa.Integer(), nullable=False),
    sa.Column('config', sa.JSON(), nullable=False),
    sa.Column('state', sa.Enum(*TRIAL_STATES, name='trialstate', native_enum=False, length=16), nullable=False),
    sa.Column('reason', sa.String(length=64), nullable=False),
    sa.Column('message', sa.Text(), nullable=False),
    sa.Column('iterations', sa.Integer(), nullable=False),
    sa.Column('latest_metrics', sa.JSON(), nullable=True),
    sa.Column('best_metric', sa.Double(), nullable=True),
    sa.Column('best_epoch', sa.Integer(), nullable=True),
    sa.Column('checkpoint_path', sa.String(length=4096), nullable=True),
    sa.Column('stopped_early', sa.Boolean(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['sweep_id'], ['sweeps.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('sweep_id', 'tune_id', name='uq_trials_sweep_tune_id')
    )
    with op.batch_alter_table('trials', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_trials_sweep_id'), ['sweep_id'], unique=False)

    op.create_table('trial_metrics',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('trial_id', sa.String(length=32), nullable=False),
    sa.Column('epoch', sa.Integer(), nullable=False),
    sa.Column('step', sa.Integer(), nullable=False),
    sa.Column('values', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['trial_id'], ['trials.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('trial_id', 'epoch', name='uq_trial_metrics_epoch')
    )
    with op.batch_alter_table('trial_metrics', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_trial_metrics_trial_id'), ['trial_id'], unique=False)


def downgrade() -> None:
    op.drop_table('trial_metrics')
    op.drop_table('trials')
    op.drop_table('sweep_events')
    op.drop_table('sweeps')
