"""trial events: a trial's state history, like a job's, a sweep's and a deployment's (docs/sweeps.md)

Trials created before this revision have no history rows; from it on the state engine writes one at
creation and one per transition.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-27 10:00:00.000000
"""

from alembic import op
import sqlalchemy as sa


revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None

TRIAL_STATES = ('PENDING', 'RUNNING', 'SUCCEEDED', 'STOPPED', 'FAILED', 'CANCELLED')


def _trial_state(name: str, nullable: bool = False) -> sa.Column:
    return sa.Column(name, sa.Enum(*TRIAL_STATES, name='trialstate', native_enum=False, length=16), nullable=nullable)


def upgrade() -> None:
    op.create_table('trial_events',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('trial_id', sa.String(length=32), nullable=False),
    _trial_state('from_state', nullable=True),
    _trial_state('to_state'),
    sa.Column('reason', sa.String(length=64), nullable=False),
    sa.Column('message', sa.Text(), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['trial_id'], ['trials.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('trial_events', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_trial_events_trial_id'), ['trial_id'], unique=False)


def downgrade() -> None:
    op.drop_table('trial_events')
