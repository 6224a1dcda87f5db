"""hangs and stragglers in sweep trials (docs/jobs.md "Hangs", "Stragglers")

Revision ID: 0024
Revises: 0023
Create Date: 2026-11-29 12:40:00.000000

trials: progress_at (when its latest report arrived: a function reports many times an epoch, each one progress),
stacks_requested_at and stacks (a trial suspected hung, its ranks' answers), hung_at (its last hang
verdict: its workers were ended and restarted then), hangs (how many verdicts), stragglers and straggler_windows
(as a job's).
"""

from alembic import op
import sqlalchemy as sa


revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("trials") as batch:
        batch.add_column(sa.Column("progress_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("stacks_requested_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("stacks", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("hung_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("hangs", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("stragglers", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("straggler_windows", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("trials") as batch:
        for column in ("straggler_windows", "stragglers", "hangs", "hung_at", "stacks", "stacks_requested_at", "progress_at"):
            batch.drop_column(column)
