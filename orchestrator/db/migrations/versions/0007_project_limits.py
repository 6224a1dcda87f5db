"""project limits: a project's max_priority, set by a cluster-wide admin (docs/security.md, hole 7)

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-25 15:00:00.000000
"""

from alembic import op
import sqlalchemy as sa


revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('projects') as batch:
        batch.add_column(sa.Column('max_priority', sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('projects') as batch:
        batch.drop_column('max_priority')
