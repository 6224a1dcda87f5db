"""``orch sweeps``: submit (and follow with a live trial table), list, get, events, logs, cancel, wait,
trials, best. REF is a sweep's id or a unique prefix of its name."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from orchestrator_client.cli import exits, follow, output, runs
from orchestrator_client.cli.common import (
    CancelOnInterruptOption,
    IdempotencyKeyOption,
    SetOption,
    SpecOption,
    TimeoutOption,
    YesOption,
    spec_refusal,
)
from orchestrator_client.cli.context import client
from orchestrator_client.cli.output import OutputOption
from orchestrator_client.cli.trials import trials_table

app = typer.Typer(help="Hyperparameter sweeps (Ray Tune) and their trials.", no_args_is_help=True)
Ref = Annotated[str, typer.Argument(help="The sweep's id or a unique prefix of its name.", show_default=False)]


@app.command()
def submit(
    ctx: typer.Context,
    file: SpecOption,
    set_: SetOption = None,
    name: Annotated[str | None, typer.Option(help="The sweep's name (overrides the spec's).")] = None,
    idempotency_key: IdempotencyKeyOption = None,
    follow_: Annotated[bool, typer.Option("--follow", "-F", help="Show a live trial table until it ends.")] = False,
    timeout: TimeoutOption = None,
    cancel_on_interrupt: CancelOnInterruptOption = False,
    fmt: OutputOption = output.Format.table,
) -> None:
    """Start a sweep from a spec file; with --follow, watch its trials and exit with its result."""
    spec = runs.load_spec(file, set_, name)
    with spec_refusal(spec):
        sweep = client(ctx).sweeps.submit(spec.data, idempotency_key=idempotency_key)
    if not follow_:
        output.emit(sweep, fmt, lambda s: f"sweep {s.id} submitted ({s.state}, {s.total_trials} trials)")
        return
    output.note(f"sweep {sweep.id} submitted; following (Ctrl-C stops following, the sweep goes on)")
    raise typer.Exit(follow.SweepFollow(sweep, timeout, cancel_on_interrupt).run())


@app.command("list")
def list_(
    ctx: typer.Context,
    state: Annotated[list[str] | None, typer.Option(help="Only sweeps in this state (repeat for several).")] = None,
    name: Annotated[str | None, typer.Option(help="Only sweeps whose name starts with this.")] = None,
    limit: Annotated[int, typer.Option(help="At most this many (newest first).", min=1)] = 50,
    fmt: OutputOption = output.Format.table,
) -> None:
    """List sweeps, newest first."""
    states = [s.upper() for s in state] if state else None
    output.emit_rows(
        client(ctx).sweeps.list(state=states, name_prefix=name, limit=limit),
        fmt,
        ["ID", "NAME", "STATE", "REASON", "TRIALS", "METRIC", "BEST", "CREATED"],
        lambda s: (s.id, s.name, s.state, s.reason, _trial_counts(s), f"{s.metric} ({s.mode})", _best(s), s.created_at),
    )


@app.command()
def get(ctx: typer.Context, ref: Ref, fmt: OutputOption = output.Format.table) -> None:
    """A sweep: its state, trials by state and best trial so far."""
    output.emit(
        client(ctx).sweeps.get(ref),
        fmt,
        lambda s: output.detail(
            s,
            ["id", "name", "project_id", "workload", "state", "reason", "message", "attempt", "metric", "mode",
             "total_trials", "trials", "best_trial", "created_at", "started_at", "finished_at"],
        ),
    )  # fmt: skip


@app.command()
def events(ctx: typer.Context, ref: Ref, fmt: OutputOption = output.Format.table) -> None:
    """A sweep's state changes, oldest first."""
    runs.show_events(client(ctx).sweeps.get(ref), fmt)


@app.command()
def logs(
    ctx: typer.Context,
    ref: Ref,
    attempt: Annotated[int | None, typer.Option(help="An earlier attempt's output.", min=1)] = None,
    tail: Annotated[int | None, typer.Option(help="Only the last N lines.", min=0)] = None,
) -> None:
    """The sweep driver's output."""
    runs.print_logs(client(ctx).sweeps.get(ref).logs(attempt=attempt, tail=tail))


@app.command()
def cancel(ctx: typer.Context, ref: Ref, yes: YesOption = False, fmt: OutputOption = output.Format.table) -> None:
    """Cancel a sweep and its running trials (asks first unless -y)."""
    runs.cancel("sweep", client(ctx).sweeps.get(ref), yes=yes, fmt=fmt)


@app.command()
def wait(
    ctx: typer.Context,
    ref: Ref,
    timeout: TimeoutOption = None,
    follow_: Annotated[bool, typer.Option("--follow", "-F", help="Show the live trial table while waiting.")] = False,
    fmt: OutputOption = output.Format.table,
) -> None:
    """Wait until a sweep ends; exit with its result (0 SUCCEEDED, 1 FAILED, 3 CANCELLED, 124 timeout)."""
    sweep = client(ctx).sweeps.get(ref)
    if follow_:
        raise typer.Exit(follow.SweepFollow(sweep, timeout).run())
    runs.wait(
        "sweep", sweep, timeout=timeout, fmt=fmt, final_line=lambda s: f"sweep {s.id} {s.state} {_best(s)}".rstrip()
    )


@app.command()
def trials(ctx: typer.Context, ref: Ref, fmt: OutputOption = output.Format.table) -> None:
    """A sweep's trials: state, config, epochs, best metric, stopped early."""
    sweep = client(ctx).sweeps.get(ref)
    output.emit(list(sweep.list_trials()), fmt, lambda ts: trials_table(sweep, ts))


@app.command()
def best(ctx: typer.Context, ref: Ref, fmt: OutputOption = output.Format.table) -> None:
    """The sweep's best trial so far (its id deploys with a source {"trial_id": id}); exit 1 while there is none."""
    sweep = client(ctx).sweeps.get(ref)
    if sweep.best_trial is None:
        typer.echo(f"sweep {sweep.id} has no best trial yet ({sweep.state})", err=True)
        raise typer.Exit(exits.FAILED)
    output.emit(sweep.best_trial, fmt, output.detail)


def _trial_counts(sweep: Any) -> str:
    done = sum(n for state, n in (sweep.trials or {}).items() if state not in ("PENDING", "RUNNING"))
    return f"{done}/{sweep.total_trials}"


def _best(sweep: Any) -> str:
    best = sweep.best_trial
    return "" if best is None else f"{best.metric:.4g}"
