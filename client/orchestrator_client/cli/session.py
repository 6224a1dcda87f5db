"""``orch login``, ``orch whoami``, ``orch status``."""

from __future__ import annotations

from typing import Annotated

import typer

from orchestrator_client import Client
from orchestrator_client.cli import exits, output
from orchestrator_client.cli.context import client, globals_of
from orchestrator_client.cli.output import OutputOption
from orchestrator_client.config import config_path, save_profile


def register(app: typer.Typer) -> None:
    app.command()(login)
    app.command()(whoami)
    app.command()(status)


def login(
    ctx: typer.Context,
    url: Annotated[str | None, typer.Option(help="The service's URL.")] = None,
    token: Annotated[str | None, typer.Option(help="The API key (asked for, unechoed, when not given).")] = None,
    profile: Annotated[str | None, typer.Option(help="The profile to write.")] = None,
) -> None:
    """Check an API key against the service (whoami) and save URL and key as a profile (file mode 0600)."""
    options = globals_of(ctx)
    url, profile = url or options.url, profile or options.profile or "default"
    token = token or options.token or typer.prompt("API key", hide_input=True)
    with Client(url=url, token=token) as checked:  # not the profile: it may not exist yet
        who = checked.whoami()
        save_profile(profile, checked.url, token, make_default=True)
        target = checked.url
    output.note(
        f"logged in to {target} as {who.key_name or who.key_id or 'admin'} ({who.role}"
        f"{', cluster admin' if who.cluster_admin else ''}) in project {who.project_name or who.project_id or '-'}; "
        f"profile {profile!r} saved to {config_path()}"
    )


def whoami(ctx: typer.Context, fmt: OutputOption = output.Format.table) -> None:
    """The key in use: its name, role and project."""
    orch = client(ctx)
    who = orch.whoami()
    output.emit(who, fmt, lambda w: output.detail(w))
    if fmt is output.Format.table:
        output.note(f"{orch.url} (profile {orch.profile})" if orch.profile else orch.url)


def status(ctx: typer.Context, fmt: OutputOption = output.Format.table) -> None:
    """The service's readiness, the cluster's resources and the queue; exit 1 while the service is not ready."""
    orch = client(ctx)
    ready = orch.ready()
    cluster = orch.cluster()
    both = {"url": orch.url, "ready": ready, "cluster": output.data(cluster)}
    output.emit(both, fmt, lambda _: _render(orch.url, ready, cluster))
    if not is_ready(ready):
        raise typer.Exit(exits.FAILED)


def is_ready(ready: dict) -> bool:
    """The SDK's ``ready()``: the database and Ray both answer (/readyz's 200 alone means the API serves)."""
    return bool(ready.get("ready"))


def _render(url, ready, cluster):
    from rich.console import Group
    from rich.text import Text

    # The headline on a line of its own: as a table's title it would wrap to the narrow table's width.
    checks = ", ".join(f"{name} {value}" for name, value in ready.items() if name != "ready")
    headline = Text(f"{url}: {'ready' if is_ready(ready) else 'NOT READY'} ({checks}); Ray {cluster.ray}")
    resources = output.table(
        ["RESOURCE", "AVAILABLE", "TOTAL"],
        ((name, cluster.available.get(name, 0), total) for name, total in sorted(cluster.total.items())),
    )
    jobs = output.table(["STATE", "JOBS"], ((state, n) for state, n in sorted(cluster.jobs.items()) if n))
    parts = [
        headline,
        Text(""),
        resources,
        Text(""),
        jobs if cluster.jobs and any(cluster.jobs.values()) else Text("no jobs"),
    ]
    if cluster.queue:
        queue = output.table(
            ["QUEUED", "NAME", "PRIORITY", "REASON", "MESSAGE"],
            ((q.id, q.name, q.priority, q.reason, q.message) for q in cluster.queue),
        )
        parts += [Text(""), queue]
    if cluster.bad_nodes:
        bad = output.table(
            ["BAD NODE", "KEPT OUT UNTIL", "FAULTS"],
            ((b.node_id, b.excluded_until.isoformat(timespec="seconds"), b.fault_count) for b in cluster.bad_nodes),
        )
        parts += [Text(""), bad]
    return Group(*parts)
