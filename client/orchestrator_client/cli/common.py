"""Options and steps several nouns share: spec files with --set, confirmations, 422s against the file."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer

from orchestrator_client.cli import exits, specfile
from orchestrator_client.errors import ValidationFailed

SpecOption = Annotated[Path, typer.Option("--file", "-f", help="The spec: a YAML or JSON file.", show_default=False)]
SetOption = Annotated[
    list[str] | None,
    typer.Option("--set", help="Override a field: key.sub=value (repeat). Values are read as YAML: 3, true, [1, 2]."),
]
IdempotencyKeyOption = Annotated[
    str | None,
    typer.Option(help="Sending it again with the same key returns what the first one made (default: a fresh key)."),
]
YesOption = Annotated[bool, typer.Option("--yes", "-y", help="Do it without asking.")]
TimeoutOption = Annotated[
    float | None, typer.Option(help="Give up after this many seconds (exit 124); the job goes on.", min=0)
]
CancelOnInterruptOption = Annotated[
    bool, typer.Option(help="Ctrl-C cancels the job too (by default it only stops following).")
]


def file_or_sets(file: Path | None, sets: list[str] | None, usage: str) -> specfile.SpecFile:
    """-f FILE with its --set overrides, or the --set options alone; neither: a SpecError saying ``usage``."""
    if file is None and not sets:
        raise specfile.SpecError(usage)
    return specfile.load(file, sets) if file is not None else specfile.from_sets(sets or [])


@contextmanager
def spec_refusal(spec: specfile.SpecFile | None) -> Iterator[None]:
    """Around a call that sends ``spec``: a 422 exits 2 with its field errors (``field_errors_exit``)."""
    try:
        yield
    except ValidationFailed as error:
        raise field_errors_exit(error, spec) from None


def field_errors_exit(error: ValidationFailed, spec: specfile.SpecFile | None) -> typer.Exit:
    """A 422: the server's field errors, one a line, each pointing at the key in the file; exit 2."""
    typer.echo(f"error: the server refused the spec (422, request id {error.request_id}):", err=True)
    lines = specfile.field_error_lines(spec, error.field_errors)
    if not lines:  # a 422 with one message, not fields
        lines = [str(error.detail)]
    for line in lines:
        typer.echo(f"  {line}", err=True)
    return typer.Exit(exits.USAGE)


def confirm(question: str) -> None:
    """Ask (y/N) on a terminal; off one (a script, a pipe) refuse with exit 2: it must say -y."""
    if not sys.stdin.isatty():
        typer.echo(f"error: {question} Not asking: stdin is not a terminal. Pass -y to do it.", err=True)
        raise typer.Exit(exits.USAGE)
    if not typer.confirm(question, default=False):
        typer.echo("not done", err=True)
        raise typer.Exit(exits.FAILED)


def labels(items: list[str] | None) -> dict[str, str]:
    """``-l team=vision`` options as a mapping."""
    result = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise specfile.SpecError(f"-l {item!r}: give key=value")
        result[key] = value
    return result
