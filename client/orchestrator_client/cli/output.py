"""What ``orch`` prints: rich tables for people, ``-o json|yaml`` with the API's own keys for scripts.

Off a terminal (a pipe, a file, CI) rich prints no colour, and nothing here draws a live display: the
callers ask ``is_terminal()`` before they start one."""

from __future__ import annotations

import enum
import json
import sys
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Annotated, Any

import typer
import yaml
from pydantic import BaseModel
from rich.console import Console, RenderableType
from rich.table import Table
from rich.text import Text

# Off a terminal rich would wrap tables at 80 columns: ids and messages stay whole in a pipe instead.
_PIPE_WIDTH = 240


class Format(enum.StrEnum):
    table = "table"
    json = "json"
    yaml = "yaml"


OutputOption = Annotated[
    Format,
    typer.Option("--output", "-o", help="table (for people), json or yaml (the API's own keys, for scripts)."),
]


def is_terminal() -> bool:
    return sys.stdout.isatty()


def console(stderr: bool = False) -> Console:
    """A console over the current stdout (or stderr), made per call: tests swap the streams."""
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else _PIPE_WIDTH
    return Console(file=stream, width=width, highlight=False, soft_wrap=False)


def data(obj: Any) -> Any:
    """The API's JSON of a model (or a list of them): ``model_dump(mode="json")``."""
    if isinstance(obj, BaseModel):
        return obj.model_dump(mode="json")
    if isinstance(obj, list | tuple):
        return [data(item) for item in obj]
    if isinstance(obj, dict):
        return {key: data(value) for key, value in obj.items()}
    return obj


def emit(obj: Any, fmt: Format, render: Callable[[Any], RenderableType]) -> None:
    """Print ``obj`` as json/yaml (plain text, never wrapped or coloured) or as ``render(obj)`` for people."""
    if fmt is Format.json:
        typer.echo(json.dumps(data(obj), indent=2))
    elif fmt is Format.yaml:
        typer.echo(yaml.safe_dump(data(obj), sort_keys=False, allow_unicode=True), nl=False)
    else:
        rendered = render(obj)
        console().print(Text(rendered) if isinstance(rendered, str) else rendered)  # never read as markup


def emit_rows(items: Iterable[Any], fmt: Format, columns: Sequence[str], row: Callable[[Any], Sequence[Any]]) -> None:
    """A list: as json/yaml, or for people as a table of ``row(item)`` under ``columns``."""
    emit(list(items), fmt, lambda rows: table(columns, (row(item) for item in rows)))


def note(text: str) -> None:
    """One of orch's own lines for people (on stderr, so stdout stays the data)."""
    console(stderr=True).print(Text(text))


def table(columns: Sequence[str], rows: Iterable[Sequence[Any]], title: str | None = None) -> Table:
    """A table of ``rows``; its first column (an id or a name, what people copy) is never cut short."""
    cells = [[cell(value) for value in row] for row in rows]
    result = Table(title=title, box=None, header_style="bold", pad_edge=False)
    widest = max((len(row[0]) for row in cells if row), default=0)
    for index, column in enumerate(columns):
        result.add_column(column, no_wrap=index == 0, min_width=max(widest, len(column)) if index == 0 else None)
    for row in cells:
        result.add_row(*(Text(text) for text in row))  # Text: a message's "[rank 0/2]" is not rich markup
    return result


def detail(obj: Any, fields: Sequence[str] | None = None) -> Table:
    """One object as ``field  value`` lines: the fields named (all of them by default), nested values as
    compact JSON."""
    values = data(obj)
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column(overflow="fold")
    for key in fields or list(values):
        if key in values:
            grid.add_row(key, Text(cell(values[key])))
    return grid


def cell(value: Any) -> str:
    """A value as a table shows it: datetimes to the second, nested values as compact JSON, None as ''."""
    if value is None:
        return ""
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(value, str):
        return _short_time(value)
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, BaseModel | dict | list | tuple):
        return json.dumps(data(value), separators=(",", ":"), default=str)
    return str(value)


def metrics_text(values: dict[str, Any] | None) -> str:
    """``name=value`` pairs, numbers to 4 significant digits (no exponent for large ones: 12436 samples/s)."""
    return " ".join(f"{k}={number(v)}" for k, v in (values or {}).items())


def number(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.0f}" if abs(value) >= 1e4 and abs(value) < 1e15 else f"{value:.4g}"
    return str(value)


def _short_time(text: str) -> str:
    """An ISO timestamp the API sent, to the second; any other string as it is."""
    if len(text) >= 19 and text[4] == "-" and text[10] == "T":
        try:
            return datetime.fromisoformat(text).strftime("%Y-%m-%d %H:%M:%S")
        except ValueError:
            return text
    return text
