"""`orchestrator` command line: run the service, or apply the database migrations."""

from __future__ import annotations

import typer
import uvicorn

from orchestrator.log_format import configure_logging, uvicorn_log_config
from orchestrator.settings import Settings

app = typer.Typer(help="Training orchestration service on Ray.", no_args_is_help=True)


@app.callback()
def main() -> None:
    """Training orchestration service on Ray."""


@app.command()
def serve() -> None:
    """Run the control plane in the foreground (configuration: ORCHESTRATOR_* environment variables)."""
    settings = Settings()
    configure_logging(settings.log_format)
    if settings.api_workers > 1:
        _prepare_for_workers(settings)
    # By import string: `orchestrator` never imports `api` (DESIGN.md); the factory reads Settings itself, in
    # each worker process.
    uvicorn.run(
        "api.app:serve_app",
        factory=True,
        host=settings.host,
        port=settings.port,
        workers=settings.api_workers,
        log_level="info",
        log_config=uvicorn_log_config(settings.log_format),
    )


def _prepare_for_workers(settings: Settings) -> None:
    """Several workers are several replicas on one port: refuse what only one process may do, then migrate and
    make the bootstrap key once, here, before the workers start and would each try at once."""
    from sqlalchemy.engine import make_url

    from orchestrator.control_plane import ControlPlane

    if make_url(settings.database_url).get_backend_name() != "postgresql":
        raise typer.BadParameter(
            f"ORCHESTRATOR_API_WORKERS={settings.api_workers} needs PostgreSQL (ORCHESTRATOR_DATABASE_URL): "
            "SQLite is one process; set ORCHESTRATOR_API_WORKERS=1"
        )
    if not settings.ray_address:
        raise typer.BadParameter(
            f"ORCHESTRATOR_API_WORKERS={settings.api_workers} needs RAY_ADDRESS (an existing Ray cluster): each "
            "worker would otherwise start the local one; set ORCHESTRATOR_API_WORKERS=1"
        )
    plane = ControlPlane(settings, run_loops=False)
    try:
        plane.prepare_database()
    finally:
        plane.engine.dispose()


@app.command()
def migrate() -> None:
    """Upgrade the database (ORCHESTRATOR_DATABASE_URL) to the newest schema, then exit.

    `serve` does this on start too; this command is for a deploy step that runs once before the
    control plane's replicas start (the Helm chart's pre-install/pre-upgrade Job).
    """
    from orchestrator.db.engine import make_engine
    from orchestrator.db.migrate import upgrade_head

    settings = Settings()
    configure_logging(settings.log_format)
    engine = make_engine(settings.database_url)
    try:
        upgrade_head(engine)
    finally:
        engine.dispose()
    typer.echo("database schema is up to date")
