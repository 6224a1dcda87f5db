"""when a run last entered QUEUED: the starvation guard's clock (docs/scheduling.md)

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-27 13:45:00.000000

jobs.queued_at, sweeps.queued_at: set by the state engine when the run is created and whenever it goes back
to QUEUED (a preempted job), so a requeued run waits its starvation_s from its requeue, not from its first
submit. The runs queued now get it from their history (the last row that entered QUEUED); the others keep
null until they are queued again (the scheduler reads null as created_at).
"""

from alembic import op
import sqlalchemy as sa


revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

_TABLES = (("jobs", "job_events", "job_id"), ("sweeps", "sweep_events", "sweep_id"))


def upgrade() -> None:
    for table, history, key in _TABLES:
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("queued_at", sa.DateTime(timezone=True), nullable=True))
        op.execute(
            f"UPDATE {table} SET queued_at = (SELECT max(h.created_at) FROM {history} h "
            f"WHERE h.{key} = {table}.id AND h.to_state = 'QUEUED') WHERE state = 'QUEUED'"
        )


def downgrade() -> None:
    for table, _, _ in _TABLES:
        with op.batch_alter_table(table) as batch:
            batch.drop_column("queued_at")
