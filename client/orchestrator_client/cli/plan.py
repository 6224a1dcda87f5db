"""``orch plan -f request.yaml``: the planner's memory, batch, learning rate and all-reduce arithmetic."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from orchestrator_client.cli import output
from orchestrator_client.cli.common import SetOption, file_or_sets, spec_refusal
from orchestrator_client.cli.context import client
from orchestrator_client.cli.output import OutputOption


def register(app: typer.Typer) -> None:
    app.command("plan")(plan)


def plan(
    ctx: typer.Context,
    file: Annotated[
        Path | None, typer.Option("--file", "-f", help="A plan request (YAML or JSON).", show_default=False)
    ] = None,
    set_: SetOption = None,
    fmt: OutputOption = output.Format.table,
) -> None:
    """Which strategy fits (DDP, FSDP...), per-GPU memory, global batch, scaled LR, all-reduce time."""
    request = file_or_sets(file, set_, "give -f request.yaml and/or --set params=1e9 --set gpu_memory_gb=80")
    with spec_refusal(request):
        answer = client(ctx).plan(request.data)
    output.emit(answer, fmt, _render)


def _render(answer):
    strategies = output.table(
        ["STRATEGY", "PER-GPU GB", "FITS", "BREAKDOWN GB"],
        (
            (name, fit.per_gpu_gb, "yes" if fit.fits else "no", output.metrics_text(fit.breakdown_gb))
            for name, fit in answer.strategies.items()
        ),
        title=f"recommended: {answer.recommended or 'none'} ({answer.reason})",
    )
    from rich.console import Group

    return Group(strategies, output.detail(answer, ["params", "global_batch", "lr", "allreduce_ms", "shortfall_gb"]))
