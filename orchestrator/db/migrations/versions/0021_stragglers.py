"""straggler detection (docs/jobs.md "Stragglers")

Revision ID: 0021
Revises: 0020
Create Date: 2026-11-28 21:00:00.000000

jobs: stragglers (the ranks of the current attempt found slower than the others: rank, ratio, step; null: none)
and straggler_windows (each rank's count of slow metric windows in a row).
"""

from alembic import op
import sqlalchemy as sa


revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("stragglers", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("straggler_windows", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("straggler_windows")
        batch.drop_column("stragglers")
