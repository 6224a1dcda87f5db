"""``orch trials``: one trial of a sweep (get, metrics, events), and the trial table ``sweeps`` shares."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from orchestrator_client.cli import output
from orchestrator_client.cli.context import client
from orchestrator_client.cli.output import OutputOption

app = typer.Typer(help="A sweep's trials.", no_args_is_help=True)
TrialId = Annotated[
    str, typer.Argument(help="The trial's id (orch sweeps trials SWEEP lists them).", show_default=False)
]


@app.command()
def get(ctx: typer.Context, trial_id: TrialId, fmt: OutputOption = output.Format.table) -> None:
    """A trial: its config, state, epochs, best metric and checkpoint."""
    output.emit(client(ctx).trials.get(trial_id), fmt, output.detail)


@app.command()
def metrics(ctx: typer.Context, trial_id: TrialId, fmt: OutputOption = output.Format.table) -> None:
    """A trial's metrics, one row an epoch."""
    output.emit_rows(
        client(ctx).trials.get(trial_id).metrics(),
        fmt,
        ["EPOCH", "STEP", "VALUES", "CHECKPOINT"],
        lambda m: (m.epoch, m.step, output.metrics_text(m.values), m.checkpoint_path),
    )


@app.command()
def events(ctx: typer.Context, trial_id: TrialId, fmt: OutputOption = output.Format.table) -> None:
    """A trial's state changes, oldest first."""
    output.emit_rows(
        client(ctx).trials.get(trial_id).events(),
        fmt,
        ["AT", "FROM", "TO", "REASON", "MESSAGE"],
        lambda e: (e.created_at, e.from_state, e.to_state, e.reason, e.message),
    )


def trials_table(sweep: Any, trials: list[Any]) -> Table:
    """state, config, epochs, best metric, stopped early: a sweep's trials at a glance."""
    title = f"sweep {sweep.id} {sweep.state}: {sweep.metric} ({sweep.mode})"
    return output.table(
        ["#", "TRIAL", "STATE", "CONFIG", "EPOCHS", f"BEST {sweep.metric}", "STOPPED EARLY"],
        (
            (
                t.number,
                t.id,
                t.state,
                t.config,
                t.iterations,
                t.best_metric,
                "yes" if t.stopped_early else "",
            )
            for t in trials
        ),
        title=title,
    )
