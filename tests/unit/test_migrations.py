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


def test_replicas_that_start_together_on_a_fresh_postgresql_all_upgrade(postgres_server):
    """Two replicas and the chart's migration Job start at once on an empty database: without the advisory lock
    around the upgrade, two of them create the same tables and one fails (CREATE TABLE ... already exists).
    Separate processes, as in production (Alembic's ``context`` is one per process: threads would share it)."""
    import subprocess
    import sys

    from sqlalchemy import text

    from tests.conftest import _fresh_pg_database

    databases = _fresh_pg_database(postgres_server)
    url = next(databases)
    code = (
        "import sys; from sqlalchemy import create_engine; from orchestrator.db.migrate import upgrade_head; "
        "upgrade_head(create_engine(sys.argv[1]))"
    )
    try:
        upgraders = [
            subprocess.Popen(
                [sys.executable, "-c", code, url], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
            for _ in range(4)
        ]
        outputs = [upgrader.communicate(timeout=300)[0] for upgrader in upgraders]
        assert [upgrader.returncode for upgrader in upgraders] == [0, 0, 0, 0], outputs
        engine = create_engine(url)
        try:
            with engine.connect() as connection:
                assert connection.execute(text("SELECT count(*) FROM alembic_version")).scalar() == 1
        finally:
            engine.dispose()
    finally:
        next(databases, None)  # drops the database
