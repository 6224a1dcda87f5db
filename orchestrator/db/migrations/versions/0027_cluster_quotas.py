"""per-cluster quotas (docs/clusters.md)

Revision ID: 0027
Revises: 0026
Create Date: 2026-11-29 21:00:00.000000

projects.per_cluster: a project's caps on single clusters, {cluster name: {max_cpus, max_gpus, max_running_jobs}},
on top of its quota across all clusters. Null: no cap on any one cluster.
"""

from alembic import op
import sqlalchemy as sa


revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("projects") as batch:
        batch.add_column(sa.Column("per_cluster", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("projects") as batch:
        batch.drop_column("per_cluster")
