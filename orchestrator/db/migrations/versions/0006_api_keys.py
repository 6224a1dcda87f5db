"""api keys: cluster-wide is a kind of key of its own (a project's admin key acts in its project only);
a key's expiry and when it was last used

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-25 14:00:00.000000
"""

from alembic import op
import sqlalchemy as sa


revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('api_keys') as batch:
        batch.add_column(sa.Column('cluster_wide', sa.Boolean(), nullable=False, server_default=sa.false()))
        batch.add_column(sa.Column('expires_at', sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column('last_used_at', sa.DateTime(timezone=True), nullable=True))
    # Until now every admin key acted on every project. Only the key the service itself printed at its
    # first start (admin, named 'bootstrap', in the default project) keeps that; every other key is
    # confined to its project from here on.
    op.execute(
        "UPDATE api_keys SET cluster_wide = TRUE WHERE role = 'admin' AND name = 'bootstrap' "
        "AND project_id IN (SELECT id FROM projects WHERE name = 'default')"
    )


def downgrade() -> None:
    with op.batch_alter_table('api_keys') as batch:
        batch.drop_column('last_used_at')
        batch.drop_column('expires_at')
        batch.drop_column('cluster_wide')
