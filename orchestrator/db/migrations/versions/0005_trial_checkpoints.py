"""trial checkpoints: each trial epoch's checkpoint folder, while retention keeps it; when a trial started

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-25 11:40:00.000000
"""

from alembic import op
import sqlalchemy as sa


revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('trial_metrics') as batch:
        batch.add_column(sa.Column('checkpoint_path', sa.String(length=4096), nullable=True))
    with op.batch_alter_table('trials') as batch:
        batch.add_column(sa.Column('started_at', sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('trials') as batch:
        batch.drop_column('started_at')
    with op.batch_alter_table('trial_metrics') as batch:
        batch.drop_column('checkpoint_path')
