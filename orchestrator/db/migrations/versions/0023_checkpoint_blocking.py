"""checkpoint blocking (docs/jobs.md "Goodput")

Revision ID: 0023
Revises: 0022
Create Date: 2026-11-29 08:40:00.000000

job_metrics: checkpoint_blocked_s, the seconds checkpoints blocked training since the run's previous metric point.
"""

from alembic import op
import sqlalchemy as sa


revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("job_metrics") as batch:
        batch.add_column(sa.Column("checkpoint_blocked_s", sa.Float(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("job_metrics") as batch:
        batch.drop_column("checkpoint_blocked_s")
