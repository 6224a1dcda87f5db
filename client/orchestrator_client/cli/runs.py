"""The steps ``orch jobs`` and ``orch sweeps`` take alike on a run (a Job or a Sweep): print its logs, show its
state changes, cancel it after asking, wait for its end and exit with its result."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import typer

from orchestrator_client.cli import exits, output, specfile
from orchestrator_client.cli.common import confirm
from orchestrator_client.errors import WaitTimeout


def load_spec(file: Path, sets: list[str] | None, name: str | None) -> specfile.SpecFile:
    """The spec file with its --set overrides, and ``--name`` over the spec's name."""
    spec = specfile.load(file, sets)
    if name is not None:
        spec.data["name"] = name
    return spec


def print_logs(lines: Iterable[str]) -> None:
    """Each line as it comes (flushed: a follow shows output live); Ctrl-C ends it with exit 130."""
    try:
        for line in lines:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
    except KeyboardInterrupt:
        raise typer.Exit(exits.INTERRUPTED) from None


def show_events(run: Any, fmt: output.Format) -> None:
    """A run's state changes, oldest first."""
    output.emit(list(run.events()), fmt, events_table)


def cancel(noun: str, run: Any, *, yes: bool, fmt: output.Format) -> None:
    """Ask (unless ``yes``), cancel, print its new state."""
    if not yes:
        confirm(f"Cancel {noun} {run.id} ({run.name or run.workload}, {run.state})?")
    run = run.cancel()
    output.emit(run, fmt, lambda r: f"{noun} {r.id} {r.state}")


def wait(noun: str, run: Any, *, timeout: float | None, fmt: output.Format, final_line: Callable[[Any], str]) -> None:
    """Wait for the run's end, print ``final_line(run)`` and exit with its result (124 past ``timeout``: the run
    goes on; 130 on Ctrl-C)."""
    try:
        run = run.wait(timeout=timeout)
    except WaitTimeout:
        typer.echo(f"timed out after {timeout:g} s: {noun} {run.id} goes on", err=True)
        raise typer.Exit(exits.TIMEOUT) from None
    except KeyboardInterrupt:
        raise typer.Exit(exits.INTERRUPTED) from None
    output.emit(run, fmt, final_line)
    raise typer.Exit(exits.for_state(run.state))


def events_table(events: list[Any]):
    return output.table(
        ["AT", "FROM", "TO", "REASON", "ATTEMPT", "MESSAGE"],
        (
            (
                e.created_at,
                e.from_state,
                e.to_state,
                e.reason,
                e.attempt,
                (e.message or "").splitlines()[0][:200] if e.message else "",
            )
            for e in events
        ),
    )
