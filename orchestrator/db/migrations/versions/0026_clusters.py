"""several Ray clusters behind one control plane (docs/clusters.md)

Revision ID: 0026
Revises: 0025
Create Date: 2026-11-29 16:00:00.000000

clusters: the registered Ray clusters (name, dashboard address, where the token is read, labels, storage root,
Serve URL, tenancy, the default one); project_clusters: which clusters a project may use; jobs, sweeps, deployments:
cluster, the name of the cluster each runs on (None: the default one).
"""

from alembic import op
import sqlalchemy as sa


revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "clusters",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("name", sa.String(64), nullable=False, unique=True),
        sa.Column("address", sa.String(512), nullable=False),
        sa.Column("token_ref", sa.String(512), nullable=True),
        sa.Column("labels", sa.JSON(), nullable=False),
        sa.Column("storage_root", sa.String(1024), nullable=True),
        sa.Column("serve_url", sa.String(512), nullable=True),
        sa.Column("tenancy", sa.String(16), nullable=False),
        sa.Column("is_default", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "project_clusters",
        sa.Column("project_id", sa.String(32), sa.ForeignKey("projects.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("cluster_id", sa.String(32), sa.ForeignKey("clusters.id", ondelete="CASCADE"), primary_key=True),
    )
    op.create_index("ix_project_clusters_cluster", "project_clusters", ["cluster_id"])
    for table in ("jobs", "sweeps", "deployments"):
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("cluster", sa.String(64), nullable=True))


def downgrade() -> None:
    for table in ("deployments", "sweeps", "jobs"):
        with op.batch_alter_table(table) as batch:
            batch.drop_column("cluster")
    op.drop_index("ix_project_clusters_cluster", "project_clusters")
    op.drop_table("project_clusters")
    op.drop_table("clusters")
