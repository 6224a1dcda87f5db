"""``orch projects`` (create, list, get, update, quota) and ``orch keys`` (create, list, revoke): cluster and
project admins."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from orchestrator_client.cli import output
from orchestrator_client.cli.common import YesOption, confirm
from orchestrator_client.cli.context import client
from orchestrator_client.cli.output import OutputOption
from orchestrator_client.errors import NotFound

app = typer.Typer(help="Projects, the tenants (cluster-wide admins create and limit them).", no_args_is_help=True)
keys_app = typer.Typer(help="A project's API keys (its admins).", no_args_is_help=True)
ProjectRef = Annotated[str, typer.Argument(help="The project's id or name.", show_default=False)]
ProjectOption = Annotated[str, typer.Option("--project", "-p", help="The project's id or name.", show_default=False)]
MaxPriority = Annotated[
    int | None, typer.Option(help="The highest priority the project's keys may give a job or sweep.")
]


def _projects_table(projects: list[Any]):
    return output.table(
        ["ID", "NAME", "MAX PRIORITY", "CREATED"], ((p.id, p.name, p.max_priority, p.created_at) for p in projects)
    )


@app.command()
def create(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Lower-case letters, digits, '_' and '-'.", show_default=False)],
    max_priority: MaxPriority = None,
    fmt: OutputOption = output.Format.table,
) -> None:
    """Create a project."""
    limits = {} if max_priority is None else {"max_priority": max_priority}
    project = client(ctx).projects.create(name, **limits)
    output.emit(project, fmt, lambda p: f"project {p.name} created: {p.id}")


@app.command("list")
def list_(ctx: typer.Context, fmt: OutputOption = output.Format.table) -> None:
    """List projects (a project key sees its own)."""
    output.emit(list(client(ctx).projects.list()), fmt, _projects_table)


@app.command()
def get(ctx: typer.Context, project: ProjectRef, fmt: OutputOption = output.Format.table) -> None:
    """A project."""
    output.emit(resolve(ctx, project), fmt, output.detail)


@app.command()
def update(
    ctx: typer.Context, project: ProjectRef, max_priority: MaxPriority = None, fmt: OutputOption = output.Format.table
) -> None:
    """Set a project's limits."""
    found = resolve(ctx, project)
    updated = client(ctx).projects.update(found.id, max_priority=max_priority)
    output.emit(updated, fmt, output.detail)


@app.command()
def quota(
    ctx: typer.Context,
    project: ProjectRef,
    max_cpus: Annotated[float | None, typer.Option(help="CPUs its runs and replicas may hold.")] = None,
    max_gpus: Annotated[float | None, typer.Option(help="GPUs they may hold.")] = None,
    max_running_jobs: Annotated[int | None, typer.Option(help="Jobs and sweeps running at once.")] = None,
    max_queued: Annotated[int | None, typer.Option(help="Jobs and sweeps queued; past it a submit is a 429.")] = None,
    weight: Annotated[float, typer.Option(help="Its weight in fair share between projects.")] = 1.0,
    borrowing: Annotated[bool, typer.Option(help="May use idle capacity beyond its CPU/GPU quota.")] = True,
    per_cluster: Annotated[
        list[str] | None,
        typer.Option(
            "--per-cluster",
            help="A cap on one cluster, on top of the quota: CLUSTER:LIMIT=N[,LIMIT=N] with max_cpus, max_gpus or "
            "max_running_jobs (e.g. gpu-a:max_gpus=8,max_running_jobs=2); repeat it for more clusters.",
            show_default=False,
        ),
    ] = None,
    fmt: OutputOption = output.Format.table,
) -> None:
    """Replace a project's quota (cluster-wide admins); a limit left out is no limit (docs/scheduling.md)."""
    caps = dict(_cluster_cap(text) for text in per_cluster or [])
    found = resolve(ctx, project)
    updated = client(ctx).projects.set_quota(
        found.id,
        max_cpus=max_cpus,
        max_gpus=max_gpus,
        max_running_jobs=max_running_jobs,
        max_queued=max_queued,
        weight=weight,
        borrowing=borrowing,
        per_cluster=caps,
    )
    output.emit(updated.quota, fmt, output.detail)


CAP_LIMITS = ("max_cpus", "max_gpus", "max_running_jobs")


def _cluster_cap(text: str) -> tuple[str, dict[str, float]]:
    """``gpu-a:max_gpus=8,max_running_jobs=2`` as ("gpu-a", {"max_gpus": 8, "max_running_jobs": 2}); the server
    checks the cluster's name and the values."""
    cluster, colon, limits = text.partition(":")
    cap: dict[str, float] = {}
    for item in limits.split(",") if colon else []:
        name, equals, value = (part.strip() for part in item.partition("="))
        try:
            cap[name] = int(value) if name == "max_running_jobs" else float(value)
        except ValueError:
            equals = ""
        if not equals or name not in CAP_LIMITS:
            break
    else:
        if cluster.strip() and cap:
            return cluster.strip(), cap
    raise typer.BadParameter(
        f"{text!r}: write CLUSTER:LIMIT=N[,LIMIT=N], each LIMIT one of {', '.join(CAP_LIMITS)} "
        "(e.g. gpu-a:max_gpus=8,max_running_jobs=2)",
        param_hint="--per-cluster",
    )


def resolve(ctx: typer.Context, ref: str) -> Any:
    """A project by id, else by its name (NotFound when neither)."""
    orch = client(ctx)
    try:
        return orch.projects.get(ref)
    except NotFound:
        for project in orch.projects.list():
            if project.name == ref:
                return project
        raise


@keys_app.command("create")
def create_key(
    ctx: typer.Context,
    project: ProjectOption,
    role: Annotated[str, typer.Option(help="admin, member or viewer.")] = "member",
    name: Annotated[str, typer.Option(help="A label for people.")] = "",
    fmt: OutputOption = output.Format.table,
) -> None:
    """Make an API key; its secret is shown this once."""
    key = client(ctx).projects.keys(resolve(ctx, project).id).create(role, name)
    output.emit(key, fmt, lambda k: output.detail(k, ["id", "name", "role", "project_id", "expires_at", "key"]))


@keys_app.command("list")
def list_keys(ctx: typer.Context, project: ProjectOption, fmt: OutputOption = output.Format.table) -> None:
    """A project's keys (never their secrets)."""
    output.emit_rows(
        client(ctx).projects.keys(resolve(ctx, project).id).list(),
        fmt,
        ["ID", "NAME", "ROLE", "PREFIX", "CREATED", "EXPIRES", "LAST USED"],
        lambda k: (k.id, k.name, k.role, k.prefix, k.created_at, k.expires_at, k.last_used_at),
    )


@keys_app.command()
def revoke(
    ctx: typer.Context,
    key_id: Annotated[str, typer.Argument(help="The key's id (orch keys list).", show_default=False)],
    project: ProjectOption,
    yes: YesOption = False,
) -> None:
    """Revoke a key: it stops working at once (asks first unless -y)."""
    project_id = resolve(ctx, project).id
    if not yes:
        confirm(f"Revoke key {key_id} of project {project_id}?")
    client(ctx).projects.keys(project_id).revoke(key_id)
    output.note(f"key {key_id} revoked")
