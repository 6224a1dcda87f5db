"""run claims and reported ends (docs/security.md, findings 1 and 2)

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-02 10:00:00.000000

jobs and sweeps: claim_hash (the SHA-256 of the attempt's one-use claim code, which its driver exchanges for the
run's token: Ray lists a job's environment, so no token is put there), claimed_by (the SHA-256 of the nonce of
the driver that exchanged it; "" until then), reported_end (the run's own report of its end, held until Ray
confirms that the Ray job ended; null: none held). Runs started before keep their tokens (token_hash) and
report as before; their next attempt claims.
"""

from alembic import op
import sqlalchemy as sa


revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

_TABLES = ("jobs", "sweeps")


def upgrade() -> None:
    for table in _TABLES:
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("claim_hash", sa.String(length=64), nullable=False, server_default=""))
            batch.add_column(sa.Column("claimed_by", sa.String(length=64), nullable=False, server_default=""))
            batch.add_column(sa.Column("reported_end", sa.JSON(), nullable=True))


def downgrade() -> None:
    for table in _TABLES:
        with op.batch_alter_table(table) as batch:
            for column in ("reported_end", "claimed_by", "claim_hash"):
                batch.drop_column(column)
