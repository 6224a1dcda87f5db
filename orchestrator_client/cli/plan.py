"""``orch plan -f request.yaml``: the planner's memory, batch, learning rate and all-reduce arithmetic."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from orchestrator_client.cli import output, specfile
from orchestrator_client.cli.common import SetOption, field_errors_exit
from orchestrator_client.cli.context import client
from orchestrator_client.cli.output import OutputOption
from orchestrator_client.errors import ValidationFailed


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
    if file is None and not set_:
        raise specfile.SpecError("give -f request.yaml and/or --set params=1e9 --set gpu_memory_gb=80")
    request = specfile.load(file, set_) if file is not None else specfile.from_sets(set_ or [])
    try:
        answer = client(ctx).plan(request.data)
    except ValidationFailed as error:
        raise field_errors_exit(error, request) from None
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
