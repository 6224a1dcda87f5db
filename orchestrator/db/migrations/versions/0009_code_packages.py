"""code packages: a project's uploaded code (docs/code.md), content-addressed by the upload's SHA-256

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-28 10:00:00.000000
"""

from alembic import op
import sqlalchemy as sa


revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('code_packages',
    sa.Column('id', sa.String(length=32), nullable=False),
    sa.Column('project_id', sa.String(length=32), nullable=False),
    sa.Column('sha256', sa.String(length=64), nullable=False),
    sa.Column('size', sa.BigInteger(), nullable=False),
    sa.Column('file_count', sa.Integer(), nullable=False),
    sa.Column('files', sa.JSON(), nullable=False),
    sa.Column('package_sha256', sa.String(length=64), nullable=False),
    sa.Column('package_size', sa.BigInteger(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('last_used_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['project_id'], ['projects.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('project_id', 'sha256', name='uq_code_packages_project_sha256')
    )


def downgrade() -> None:
    op.drop_table('code_packages')
