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
    # By import string: `orchestrator` never imports `api` (DESIGN.md); create_app reads Settings itself.
    uvicorn.run(
        "api.app:create_app",
        factory=True,
        host=settings.host,
        port=settings.port,
        log_level="info",
        log_config=uvicorn_log_config(settings.log_format),
    )


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
