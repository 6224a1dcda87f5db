"""``orch deployments``: create, list, get, update, rollback, delete, events, predict. By name."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from orchestrator_client.cli import output, specfile
from orchestrator_client.cli.common import (
    IdempotencyKeyOption,
    SetOption,
    YesOption,
    confirm,
    file_or_sets,
    spec_refusal,
)
from orchestrator_client.cli.context import client
from orchestrator_client.cli.output import OutputOption

app = typer.Typer(help="Models served over HTTP (Ray Serve), by name.", no_args_is_help=True)
Name = Annotated[str, typer.Argument(help="The deployment's name.", show_default=False)]
_USAGE = "give -f FILE and/or --set key=value"
OptionalSpec = Annotated[
    Path | None, typer.Option("--file", "-f", help="A YAML or JSON file with the fields.", show_default=False)
]


@app.command()
def create(
    ctx: typer.Context,
    file: OptionalSpec = None,
    set_: SetOption = None,
    idempotency_key: IdempotencyKeyOption = None,
    fmt: OutputOption = output.Format.table,
) -> None:
    """Deploy a checkpoint: -f deployment.yaml and/or --set name=digits --set source.job_id=ID."""
    spec = file_or_sets(file, set_, _USAGE)
    with spec_refusal(spec):
        deployment = client(ctx).deployments.create(spec.data, idempotency_key=idempotency_key)
    output.emit(deployment, fmt, lambda d: f"deployment {d.name} {d.state} (version {d.version}) at {d.url}")


@app.command("list")
def list_(ctx: typer.Context, fmt: OutputOption = output.Format.table) -> None:
    """List deployments."""
    output.emit_rows(
        client(ctx).deployments.list(),
        fmt,
        ["NAME", "STATE", "REASON", "VERSION", "SERVING", "REPLICAS", "URL"],
        lambda d: (d.name, d.state, d.reason, d.version, d.serving_version, len(d.replicas), d.url),
    )


@app.command()
def get(ctx: typer.Context, name: Name, fmt: OutputOption = output.Format.table) -> None:
    """A deployment: state, URL, versions, replicas."""
    output.emit(client(ctx).deployments.get(name), fmt, _detail)


@app.command()
def update(
    ctx: typer.Context,
    name: Name,
    file: OptionalSpec = None,
    set_: SetOption = None,
    fmt: OutputOption = output.Format.table,
) -> None:
    """Change a deployment (a new version): -f changes.yaml and/or --set replicas=2."""
    changes = file_or_sets(file, set_, _USAGE)
    deployment = client(ctx).deployments.get(name)
    with spec_refusal(changes):
        deployment = deployment.update(changes.data)
    output.emit(deployment, fmt, lambda d: f"deployment {d.name} {d.state} (version {d.version})")


@app.command()
def rollback(ctx: typer.Context, name: Name, fmt: OutputOption = output.Format.table) -> None:
    """Roll back to the version before the newest (as a new version)."""
    deployment = client(ctx).deployments.get(name).rollback()
    output.emit(deployment, fmt, lambda d: f"deployment {d.name} {d.state} (version {d.version})")


@app.command()
def delete(ctx: typer.Context, name: Name, yes: YesOption = False, fmt: OutputOption = output.Format.table) -> None:
    """Delete a deployment (asks first unless -y)."""
    deployment = client(ctx).deployments.get(name)
    if not yes:
        confirm(f"Delete deployment {deployment.name} ({deployment.url})?")
    deleted = deployment.delete()
    output.emit(deleted if deleted is not None else deployment, fmt, lambda d: f"deployment {d.name} {d.state}")


@app.command()
def events(ctx: typer.Context, name: Name, fmt: OutputOption = output.Format.table) -> None:
    """A deployment's state changes, oldest first."""
    output.emit_rows(
        client(ctx).deployments.get(name).events(),
        fmt,
        ["AT", "FROM", "TO", "REASON", "VERSION", "MESSAGE"],
        lambda e: (e.created_at, e.from_state, e.to_state, e.reason, e.version, e.message),
    )


@app.command()
def predict(
    ctx: typer.Context,
    name: Name,
    data: Annotated[
        str, typer.Option("--data", "-d", help="The request body: JSON, or @file.json.", show_default=False)
    ],
) -> None:
    """Send one request to a deployment's URL and print its JSON answer."""
    payload = _payload(data)
    answer = client(ctx).deployments.get(name).predict(payload)
    typer.echo(json.dumps(output.data(answer), indent=2))


def _payload(data: str) -> Any:
    if data.startswith("@"):
        path = Path(data[1:])
        try:
            data = path.read_text()
        except OSError as error:
            raise specfile.SpecError(f"-d {data}: cannot read {path}: {error.strerror or error}") from None
    try:
        return json.loads(data)
    except json.JSONDecodeError as error:
        raise specfile.SpecError(
            f"-d: not valid JSON (line {error.lineno}, column {error.colno}): {error.msg}"
        ) from None


def _detail(deployment: Any):
    return output.detail(
        deployment,
        ["name", "id", "project_id", "workload", "state", "reason", "message", "url", "auth", "version",
         "serving_version", "serve_status", "replicas", "current", "created_at", "updated_at"],
    )  # fmt: skip
