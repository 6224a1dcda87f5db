"""``orch code``: upload a folder or an archive as a code package, list and inspect packages."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from orchestrator_client.cli import output
from orchestrator_client.cli.context import client
from orchestrator_client.cli.output import OutputOption

app = typer.Typer(help="Your own code, uploaded for jobs (spec: code.id).", no_args_is_help=True)


@app.command()
def upload(
    ctx: typer.Context,
    path: Annotated[
        Path,
        typer.Argument(help="A folder (packed, honouring .gitignore and .orchignore) or a .zip/.tar.gz.", exists=True),
    ],
    fmt: OutputOption = output.Format.table,
) -> None:
    """Upload code; prints the id a job spec's code.id names."""
    uploaded = client(ctx).code.upload(path)
    output.emit(uploaded, fmt, lambda u: f"{u.id} ({u.files} files, {u.size} bytes)")


@app.command("list")
def list_(ctx: typer.Context, fmt: OutputOption = output.Format.table) -> None:
    """The project's code packages."""
    output.emit_rows(
        client(ctx).code.list(),
        fmt,
        ["ID", "SIZE", "FILES", "CREATED", "LAST USED"],
        lambda p: (p.id, p.size, p.files, p.created_at, p.last_used_at),
    )


@app.command()
def get(
    ctx: typer.Context,
    package_id: Annotated[str, typer.Argument(help="sha256:...", show_default=False)],
    fmt: OutputOption = output.Format.table,
) -> None:
    """A code package and its files."""
    package = client(ctx).code.get(package_id)
    output.emit(
        package,
        fmt,
        lambda p: output.table(
            ["PATH", "SIZE"],
            ((f.path, f.size) for f in p.file_list or []),
            title=f"{p.id}: {p.files} files, {p.size} bytes",
        ),
    )
