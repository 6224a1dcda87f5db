"""hang detection's stack requests (docs/jobs.md "Hangs")

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-28 20:30:00.000000

jobs: stacks_requested_at (when the current attempt was found without progress and every rank was asked for its
Python stack; null: not suspected) and stacks (the ranks' answers so far, by rank; null: none asked).
"""

from alembic import op
import sqlalchemy as sa


revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("stacks_requested_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("stacks", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("stacks")
        batch.drop_column("stacks_requested_at")
