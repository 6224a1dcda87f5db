"""start-up timelines (docs/jobs.md "Start-up timeline")

Revision ID: 0025
Revises: 0024
Create Date: 2026-11-29 13:00:00.000000

jobs, sweeps: startup, each attempt's stages of its start and when each was reached ({attempt: {stage: time}});
trials: startup, the trial's own ({stage: time}).
"""

from alembic import op
import sqlalchemy as sa


revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None


def upgrade() -> None:
    for table in ("jobs", "sweeps", "trials"):
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("startup", sa.JSON(), nullable=True))


def downgrade() -> None:
    for table in ("trials", "sweeps", "jobs"):
        with op.batch_alter_table(table) as batch:
            batch.drop_column("startup")
