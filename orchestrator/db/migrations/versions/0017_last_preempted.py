"""the last preemption of a job or sweep, kept once it waits for something else (docs/scheduling.md)

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-27 14:05:00.000000

jobs and sweeps: last_preempted_at (when it last went back to QUEUED preempted; null: never) and
last_preempted_by (by whom and why, as the requeue's message named it), set by the state engine. A queued
run's reason soon says what it waits for now (quota_exceeded, insufficient_resources): these keep the
preemption visible (JobOut, SweepOut). Runs preempted before this migration get them from their history.
"""

from alembic import op
import sqlalchemy as sa


revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

_TABLES = (("jobs", "job_events", "job_id"), ("sweeps", "sweep_events", "sweep_id"))


def upgrade() -> None:
    for table, history, key in _TABLES:
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("last_preempted_at", sa.DateTime(timezone=True), nullable=True))
            batch.add_column(sa.Column("last_preempted_by", sa.String(length=256), nullable=False, server_default=""))
        op.execute(
            f"UPDATE {table} SET last_preempted_at = (SELECT max(h.created_at) FROM {history} h "
            f"WHERE h.{key} = {table}.id AND h.to_state = 'QUEUED' AND h.reason = 'preempted') "
            "WHERE preemptions > 0"
        )


def downgrade() -> None:
    for table, _, _ in _TABLES:
        with op.batch_alter_table(table) as batch:
            batch.drop_column("last_preempted_by")
            batch.drop_column("last_preempted_at")
