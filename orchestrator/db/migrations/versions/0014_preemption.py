"""preemption: checkpoint-now requests, preemption count, non-preemptible jobs allowed per project (docs/scheduling.md)

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-26 09:00:00.000000

Per job: preempt_requested_at (asked to checkpoint now and stop; null: not asked), preempt_by (by whom and
why, for the QUEUED message), preemptions (times it went back to QUEUED preempted: attempts not counted
against its retry budget). Per project: allow_non_preemptible (its member keys may submit
``preemptible: false``).
"""

from alembic import op
import sqlalchemy as sa


revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("preempt_requested_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("preempt_by", sa.String(length=256), nullable=False, server_default=""))
        batch.add_column(sa.Column("preemptions", sa.Integer(), nullable=False, server_default="0"))
    with op.batch_alter_table("projects") as batch:
        batch.add_column(sa.Column("allow_non_preemptible", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("projects") as batch:
        batch.drop_column("allow_non_preemptible")
    with op.batch_alter_table("jobs") as batch:
        for column in ("preemptions", "preempt_by", "preempt_requested_at"):
            batch.drop_column(column)
