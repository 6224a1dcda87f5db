"""``orch usage``: what runs held (CPU-, GPU-, memory-GB-seconds, wasted time), by project, run, label or day."""

from __future__ import annotations

from typing import Annotated

import typer

from orchestrator_client.cli import output
from orchestrator_client.cli.context import client
from orchestrator_client.cli.output import OutputOption


def register(app: typer.Typer) -> None:
    app.command("usage")(usage)


def usage(
    ctx: typer.Context,
    group_by: Annotated[
        str, typer.Option("--group-by", "-g", help="project, job, label:<key> (e.g. label:team) or day.")
    ] = "project",
    start: Annotated[
        str | None, typer.Option("--from", help="Window start, ISO 8601 (UTC if no zone); default: 30 days ago.")
    ] = None,
    end: Annotated[str | None, typer.Option("--to", help="Window end (exclusive); default: now.")] = None,
    project: Annotated[
        str | None, typer.Option("--project", help="A project id (cluster-wide admins; default: every project).")
    ] = None,
    csv: Annotated[bool, typer.Option("--csv", help="Print the API's CSV (Accept: text/csv).")] = False,
    fmt: OutputOption = output.Format.table,
) -> None:
    """Usage in [from, to): held seconds x CPUs, GPUs and memory, and the time wasted by failures and preemption."""
    answer = client(ctx).usage(project_id=project, start=start, end=end, group_by=group_by, csv=csv)
    if csv:
        typer.echo(answer, nl=False)
        return
    output.emit(answer, fmt, _render)


def _render(report):
    rows = [
        (
            row.key,
            row.kind,
            row.name,
            f"{row.cpu_seconds / 3600:.3f}",
            f"{row.gpu_seconds / 3600:.3f}",
            f"{row.memory_gb_seconds / 3600:.3f}",
            f"{row.wasted_cpu_seconds / 3600:.3f}",
            _goodput(row.goodput),
        )
        for row in report.rows
    ]
    total = report.total
    rows.append(
        (
            "total",
            "",
            "",
            f"{total.cpu_seconds / 3600:.3f}",
            f"{total.gpu_seconds / 3600:.3f}",
            f"{total.memory_gb_seconds / 3600:.3f}",
            f"{total.wasted_cpu_seconds / 3600:.3f}",
            _goodput(report.goodput),
        )
    )
    window = f"{report.from_:%Y-%m-%d %H:%M} to {report.to:%Y-%m-%d %H:%M} UTC, by {report.group_by}"
    return output.table(
        ["KEY", "KIND", "NAME", "CPU-HOURS", "GPU-HOURS", "MEMORY GB-HOURS", "WASTED CPU-HOURS", "GOODPUT"],
        rows,
        title=window,
    )


def _goodput(goodput) -> str:
    """The jobs' kept training over held time, as a percentage; "-" where there is none (no job)."""
    return "-" if goodput is None or goodput.goodput is None else f"{100 * goodput.goodput:.0f}%"
