"""sweep preemption: a sweep may be asked to pause its trials and stop, and is requeued (docs/scheduling.md)

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-27 14:00:00.000000

Per sweep, as per job (0014): preempt_requested_at (asked to checkpoint its running trials now and stop; null:
not asked), preempt_by (by whom and why, for the QUEUED message), preemptions (times it went back to QUEUED
preempted: attempts not counted against its retry budget).
"""

from alembic import op
import sqlalchemy as sa


revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sweeps") as batch:
        batch.add_column(sa.Column("preempt_requested_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("preempt_by", sa.String(length=256), nullable=False, server_default=""))
        batch.add_column(sa.Column("preemptions", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("sweeps") as batch:
        for column in ("preemptions", "preempt_by", "preempt_requested_at"):
            batch.drop_column(column)
