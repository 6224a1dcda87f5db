"""preemption: checkpoint-now requests, preemptible flag (issue 20)

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-26 09:00:00.000000
"""

import sqlalchemy as sa  # noqa: F401
from alembic import op  # noqa: F401

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


# Reserved in the chain so the three parts of issue 20 can land in any order; filled in by its owner.
def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
