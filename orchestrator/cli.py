"""`orchestrator` command line: run the service."""

from __future__ import annotations

import logging

import typer
import uvicorn

from orchestrator.settings import Settings

app = typer.Typer(help="Training orchestration service on Ray.", no_args_is_help=True)


@app.callback()
def main() -> None:
    """Training orchestration service on Ray."""


@app.command()
def serve() -> None:
    """Run the control plane in the foreground (configuration: ORCHESTRATOR_* environment variables)."""
    settings = Settings()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # By import string: `orchestrator` never imports `api` (DESIGN.md); create_app reads Settings itself.
    uvicorn.run("api.app:create_app", factory=True, host=settings.host, port=settings.port, log_level="info")
