"""bad nodes (docs/jobs.md "Bad nodes")

Revision ID: 0022
Revises: 0021
Create Date: 2026-11-29 05:00:00.000000

jobs: rank_nodes (each rank's Ray node id, as rank 0 reported it with ``running``). node_faults: a hang or a
straggler blamed on a node; enough within an hour exclude the node from placement for a cool-down.
"""

from alembic import op
import sqlalchemy as sa


revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("rank_nodes", sa.JSON(), nullable=True))
    op.create_table(
        "node_faults",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("node_id", sa.String(128), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("job_id", sa.String(32), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("message", sa.String(1000), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("cleared_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("cleared_by", sa.String(256), nullable=False),
    )
    op.create_index("ix_node_faults_created_at", "node_faults", ["created_at"])


def downgrade() -> None:
    op.drop_index("ix_node_faults_created_at", table_name="node_faults")
    op.drop_table("node_faults")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("rank_nodes")
