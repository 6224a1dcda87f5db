"""the cluster a queued run waits for (docs/clusters.md)

Revision ID: 0028
Revises: 0027
Create Date: 2026-11-30 00:20:00.000000

jobs.waiting_on, sweeps.waiting_on: the cluster the scheduler last planned a QUEUED run on (it waits for that
cluster's resources or quota there), written with its waiting reason; GET /v1/cluster counts each cluster's queue
by it. Null: not planned on any cluster (no usable one, or never looked at yet).
"""

from alembic import op
import sqlalchemy as sa


revision = "0028"
down_revision = "0027"
branch_labels = None
depends_on = None


def upgrade() -> None:
    for table in ("jobs", "sweeps"):
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("waiting_on", sa.String(64), nullable=True))


def downgrade() -> None:
    for table in ("jobs", "sweeps"):
        with op.batch_alter_table(table) as batch:
            batch.drop_column("waiting_on")
