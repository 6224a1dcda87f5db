"""project quotas, fair-share weight and borrowing (docs/scheduling.md)

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-26 09:00:00.000000

Per project: max_cpus, max_gpus, max_running_jobs, max_queued (null: no limit), weight (fair share) and
borrowing (may use idle capacity beyond its quota). Per job and sweep: borrowing, whether its current
attempt was admitted on borrowed capacity (preemption takes those first).
"""

from alembic import op
import sqlalchemy as sa


revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("projects") as batch:
        batch.add_column(sa.Column("max_cpus", sa.Float(), nullable=True))
        batch.add_column(sa.Column("max_gpus", sa.Float(), nullable=True))
        batch.add_column(sa.Column("max_running_jobs", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("max_queued", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("weight", sa.Float(), nullable=False, server_default="1"))
        batch.add_column(sa.Column("borrowing", sa.Boolean(), nullable=False, server_default=sa.true()))
    for table in ("jobs", "sweeps"):
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("borrowing", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    for table in ("sweeps", "jobs"):
        with op.batch_alter_table(table) as batch:
            batch.drop_column("borrowing")
    with op.batch_alter_table("projects") as batch:
        for column in ("borrowing", "weight", "max_queued", "max_running_jobs", "max_gpus", "max_cpus"):
            batch.drop_column(column)
