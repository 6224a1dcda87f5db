"""Idempotency-Key on sweeps and deployments (docs/rest-api.md, "Retries: Idempotency-Key")

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-28 11:00:00.000000

sweeps: idempotency_key, unique per project (as jobs'). deployments: idempotency_key, unique per project, and
request_digest (the SHA-256 of the request that used it: a deployment's request is spread over its rows, so a
replay is compared by digest). Rows made before have neither: nothing replays onto them.
"""

from alembic import op
import sqlalchemy as sa


revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sweeps") as batch:
        batch.add_column(sa.Column("idempotency_key", sa.String(length=128), nullable=True))
        batch.create_unique_constraint("uq_sweeps_project_idempotency_key", ["project_id", "idempotency_key"])
    with op.batch_alter_table("deployments") as batch:
        batch.add_column(sa.Column("idempotency_key", sa.String(length=128), nullable=True))
        batch.add_column(sa.Column("request_digest", sa.String(length=64), nullable=False, server_default=""))
        batch.create_unique_constraint("uq_deployments_project_idempotency_key", ["project_id", "idempotency_key"])


def downgrade() -> None:
    with op.batch_alter_table("deployments") as batch:
        batch.drop_constraint("uq_deployments_project_idempotency_key", type_="unique")
        batch.drop_column("request_digest")
        batch.drop_column("idempotency_key")
    with op.batch_alter_table("sweeps") as batch:
        batch.drop_constraint("uq_sweeps_project_idempotency_key", type_="unique")
        batch.drop_column("idempotency_key")
