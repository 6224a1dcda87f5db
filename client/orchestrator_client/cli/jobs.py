"""``orch jobs``: submit (and follow), list, get, events, metrics, checkpoints, logs, cancel, wait, follow.
REF is a job's id or a unique prefix of its name (the SDK's ``jobs.get``)."""

from __future__ import annotations

from itertools import islice
from pathlib import Path
from typing import Annotated, Any

import typer

from orchestrator_client.cli import follow, output, runs
from orchestrator_client.cli.common import (
    CancelOnInterruptOption,
    IdempotencyKeyOption,
    SetOption,
    SpecOption,
    TimeoutOption,
    YesOption,
    labels,
    spec_refusal,
)
from orchestrator_client.cli.context import client
from orchestrator_client.cli.output import OutputOption

app = typer.Typer(help="Training jobs.", no_args_is_help=True)
Ref = Annotated[str, typer.Argument(help="The job's id or a unique prefix of its name.", show_default=False)]


@app.command()
def submit(
    ctx: typer.Context,
    file: SpecOption,
    workdir: Annotated[
        Path | None,
        typer.Option(help="Upload this folder (honouring .gitignore and .orchignore) as the job's code."),
    ] = None,
    set_: SetOption = None,
    name: Annotated[str | None, typer.Option(help="The job's name (overrides the spec's).")] = None,
    idempotency_key: IdempotencyKeyOption = None,
    follow_: Annotated[bool, typer.Option("--follow", "-F", help="Stream logs and progress until it ends.")] = False,
    timeout: TimeoutOption = None,
    cancel_on_interrupt: CancelOnInterruptOption = False,
    fmt: OutputOption = output.Format.table,
) -> None:
    """Submit a job from a spec file (YAML or JSON); with --follow, follow it to the end and exit with its result."""
    spec = runs.load_spec(file, set_, name)
    orch = client(ctx)
    if workdir is not None:
        uploaded = orch.code.upload(workdir)
        spec.data["code"] = {**(spec.data.get("code") or {}), "id": uploaded.id}
        output.note(f"uploaded {workdir} as {uploaded.id} ({uploaded.files} files, {uploaded.size} bytes)")
    with spec_refusal(spec):
        job = orch.jobs.submit(spec.data, idempotency_key=idempotency_key)
    if not follow_:
        output.emit(job, fmt, lambda j: f"job {j.id} submitted ({j.state})")
        return
    output.note(f"job {job.id} submitted; following (Ctrl-C stops following, the job goes on)")
    raise typer.Exit(follow.follow_job(job, timeout=timeout, cancel_on_interrupt=cancel_on_interrupt))


@app.command("list")
def list_(
    ctx: typer.Context,
    state: Annotated[list[str] | None, typer.Option(help="Only jobs in this state (repeat for several).")] = None,
    label: Annotated[
        list[str] | None, typer.Option("--label", "-l", help="key=value (repeat: all must match).")
    ] = None,
    name: Annotated[str | None, typer.Option(help="Only jobs whose name starts with this.")] = None,
    limit: Annotated[int, typer.Option(help="At most this many (newest first).", min=1)] = 50,
    fmt: OutputOption = output.Format.table,
) -> None:
    """List jobs, newest first."""
    states = [s.upper() for s in state] if state else None
    jobs = list(client(ctx).jobs.list(state=states, labels=labels(label) or None, name_prefix=name, limit=limit))
    output.emit(jobs, fmt, jobs_table)


@app.command()
def get(ctx: typer.Context, ref: Ref, fmt: OutputOption = output.Format.table) -> None:
    """A job: its state and why, attempt, plan, latest metrics and result."""
    output.emit(client(ctx).jobs.get(ref), fmt, job_detail)


@app.command()
def events(ctx: typer.Context, ref: Ref, fmt: OutputOption = output.Format.table) -> None:
    """A job's state changes, oldest first."""
    runs.show_events(client(ctx).jobs.get(ref), fmt)


@app.command()
def metrics(
    ctx: typer.Context,
    ref: Ref,
    limit: Annotated[int | None, typer.Option(help="At most this many reports.", min=1)] = None,
    fmt: OutputOption = output.Format.table,
) -> None:
    """A job's metrics reports, by attempt and step."""
    output.emit_rows(
        islice(client(ctx).jobs.get(ref).metrics(), limit),  # stops paging at the limit
        fmt,
        ["ATTEMPT", "EPOCH", "STEP", "VALUES", "AT"],
        lambda m: (m.attempt, m.epoch, m.step, output.metrics_text(m.values), m.created_at),
    )


@app.command()
def checkpoints(ctx: typer.Context, ref: Ref, fmt: OutputOption = output.Format.table) -> None:
    """A job's committed checkpoints (those retention keeps)."""
    output.emit_rows(
        client(ctx).jobs.get(ref).checkpoints(),
        fmt,
        ["ID", "ATTEMPT", "EPOCH", "STEP", "SIZE", "METRICS", "PATH"],
        lambda c: (c.id, c.attempt, c.epoch, c.step, _size(c.size_bytes), output.metrics_text(c.metrics), c.path),
    )


@app.command()
def logs(
    ctx: typer.Context,
    ref: Ref,
    follow_: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing until the job ends.")] = False,
    attempt: Annotated[int | None, typer.Option(help="An earlier attempt's output.", min=1)] = None,
    tail: Annotated[int | None, typer.Option(help="Only the last N lines.", min=0)] = None,
    rank: Annotated[int | None, typer.Option(help="Only the lines of this worker rank.", min=0)] = None,
) -> None:
    """A job's output (the driver's and its workers')."""
    runs.print_logs(client(ctx).jobs.get(ref).logs(follow=follow_, attempt=attempt, tail=tail, rank=rank))


@app.command()
def cancel(ctx: typer.Context, ref: Ref, yes: YesOption = False, fmt: OutputOption = output.Format.table) -> None:
    """Cancel a job (asks first unless -y)."""
    runs.cancel("job", client(ctx).jobs.get(ref), yes=yes, fmt=fmt)


@app.command()
def wait(
    ctx: typer.Context,
    ref: Ref,
    timeout: TimeoutOption = None,
    follow_: Annotated[bool, typer.Option("--follow", "-F", help="Stream logs and progress while waiting.")] = False,
    fmt: OutputOption = output.Format.table,
) -> None:
    """Wait until a job ends; exit with its result (0 SUCCEEDED, 1 FAILED, 3 CANCELLED, 124 timeout)."""
    job = client(ctx).jobs.get(ref)
    if follow_:
        raise typer.Exit(follow.follow_job(job, timeout=timeout))
    runs.wait("job", job, timeout=timeout, fmt=fmt, final_line=_final_line)


@app.command("follow")
def follow_command(
    ctx: typer.Context,
    ref: Ref,
    timeout: TimeoutOption = None,
    cancel_on_interrupt: CancelOnInterruptOption = False,
) -> None:
    """Follow a job: logs, state changes and progress until it ends; exit with its result."""
    job = client(ctx).jobs.get(ref)
    raise typer.Exit(follow.follow_job(job, timeout=timeout, cancel_on_interrupt=cancel_on_interrupt))


def jobs_table(jobs: list[Any]):
    return output.table(
        ["ID", "NAME", "WORKLOAD", "STATE", "REASON", "ATTEMPT", "EPOCH", "CREATED"],
        ((j.id, j.name, j.workload, j.state, j.reason, j.attempt, _epoch(j), j.created_at) for j in jobs),
    )


def job_detail(job: Any):
    return output.detail(
        job,
        [
            "id",
            "name",
            "project_id",
            "workload",
            "state",
            "reason",
            "message",
            "attempt",
            "priority",
            "labels",
            "created_at",
            "started_at",
            "finished_at",
            "latest_metrics",
            "result",
            "plan",
        ],
    )


def _final_line(job: Any) -> str:
    if str(job.state) == "SUCCEEDED":
        return f"job {job.id} SUCCEEDED {output.metrics_text(follow.final_metrics(job))}".rstrip()
    return f"job {job.id} {job.state} ({job.reason}): {job.message}"


def _epoch(job: Any) -> str:
    epoch = (job.latest_metrics or {}).get("epoch")
    return "" if epoch is None else f"{epoch}/{(job.spec or {}).get('epochs', '?')}"


def _size(size: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return str(size)
