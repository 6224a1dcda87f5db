"""The Alembic migrations build exactly the schema the ORM models describe, on SQLite and PostgreSQL."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine

from orchestrator.db.migrate import upgrade_head
from orchestrator.db.models import Base


def test_the_migrated_schema_matches_the_models(database_url):
    engine = create_engine(database_url)
    try:
        upgrade_head(engine)
        with engine.connect() as connection:
            differences = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    finally:
        engine.dispose()
    assert differences == [], "a model changed without a migration (or the reverse): " + repr(differences)
