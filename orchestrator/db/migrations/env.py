"""Alembic environment: runs against the engine the service hands it (see migrate.py)."""

from alembic import context

from orchestrator.db.models import Base

MIGRATION_LOCK_ID = 7_420_261_126  # any constant of our own: the advisory lock's key

engine = context.config.attributes["engine"]

with engine.connect() as connection:
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        render_as_batch=connection.dialect.name == "sqlite",  # SQLite can't ALTER most things
        compare_type=True,
    )
    with context.begin_transaction():
        if connection.dialect.name == "postgresql":
            # Replicas (and the chart's migration Job) may start together on a fresh database: one upgrades,
            # the others wait here, then read the version it committed and have nothing left to do.
            connection.exec_driver_sql(f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK_ID})")
        context.run_migrations()
    connection.commit()
