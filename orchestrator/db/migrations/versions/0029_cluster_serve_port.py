"""a cluster's Serve port (docs/clusters.md)

Revision ID: 0029
Revises: 0028
Create Date: 2026-12-07 17:50:00.000000

clusters.serve_port: the port the cluster's Ray Serve HTTP proxy listens on (Serve's http_options.port), for
clusters that share hosts with another; null: ORCHESTRATOR_SERVE_PORT, as before.
"""

from alembic import op
import sqlalchemy as sa


revision = "0029"
down_revision = "0028"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("clusters") as batch:
        batch.add_column(sa.Column("serve_port", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("clusters") as batch:
        batch.drop_column("serve_port")
