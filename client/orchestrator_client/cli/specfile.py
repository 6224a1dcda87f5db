"""Spec files (YAML or JSON) with dotted ``--set`` overrides (read and applied by the SDK's
``orchestrator_client.specs``), and where each key is in the file: a 422's field errors point at the line
that holds the field (or at the ``--set`` that gave it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from orchestrator_client.specs import SpecError, apply_override, parse_override, read_spec_file

__all__ = ["SpecError", "SpecFile", "field_error_lines", "from_sets", "load"]

Path_ = tuple[str | int, ...]


@dataclass
class SpecFile:
    path: Path | None
    data: dict[str, Any]
    lines: dict[Path_, int] = field(default_factory=dict)  # a key's path -> its 1-based line in the file
    overrides: dict[Path_, str] = field(default_factory=dict)  # a key's path -> the --set that gave it

    def where(self, loc: list[str | int] | tuple) -> str:
        """Where the field at ``loc`` (a 422's loc without "body") came from: ``file:line``, ``--set k=v``,
        or the file alone when it names nothing closer."""
        path = _known_path(loc, set(self.lines) | set(self.overrides))
        for length in range(len(path), 0, -1):
            if path[:length] in self.overrides:
                return f"--set {self.overrides[path[:length]]}"
            if path[:length] in self.lines:
                return f"{self.path}:{self.lines[path[:length]]}"
        return str(self.path) if self.path else "the spec"


def load(path: Path, sets: list[str] | None = None) -> SpecFile:
    """Read ``path`` (the SDK's reader: JSON when it ends in .json, else YAML) with each key's line, and apply
    each ``key.sub=value`` in ``sets`` (the SDK's overrides)."""
    spec = SpecFile(path, read_spec_file(path), _key_lines(path.read_text(encoding="utf-8")))
    apply_sets(spec, sets or [])
    return spec


def from_sets(sets: list[str]) -> SpecFile:
    """A spec made of ``--set`` values alone (no file)."""
    spec = SpecFile(None, {})
    apply_sets(spec, sets)
    return spec


def apply_sets(spec: SpecFile, sets: list[str]) -> None:
    for item in sets:
        apply_override(spec.data, item)
        keys, _ = parse_override(item)
        spec.overrides[tuple(keys)] = item


def _key_lines(text: str) -> dict[Path_, int]:
    """Each key's (and list item's) line, from YAML's node marks (JSON is YAML too); {} if it won't compose."""
    try:
        root = yaml.compose(text)
    except yaml.YAMLError:
        return {}
    lines: dict[Path_, int] = {}

    def walk(node: yaml.Node, path: Path_) -> None:
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                child = (*path, str(key_node.value))
                lines[child] = key_node.start_mark.line + 1
                walk(value_node, child)
        elif isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                child = (*path, index)
                lines[child] = item.start_mark.line + 1
                walk(item, child)

    if root is not None:
        walk(root, ())
    return lines


def _known_path(loc: list[str | int] | tuple, known: set[Path_]) -> Path_:
    """``loc`` with the parts that name no key of the file left out (pydantic adds a union member's tag,
    e.g. ``search_space.lr.uniform.low``): the path of the deepest key the file or a --set has."""
    path: Path_ = ()
    for part in loc:
        for candidate in ((*path, part), (*path, str(part))):
            if candidate in known or any(k[: len(candidate)] == candidate for k in known):
                path = candidate
                break
    return path


def field_path(loc: list[str | int] | tuple) -> tuple[str | int, ...]:
    """A 422's loc without its leading ``body``."""
    return tuple(loc[1:]) if loc and loc[0] == "body" else tuple(loc)


def field_error_lines(spec: SpecFile | None, errors: list) -> list[str]:
    """A 422's field errors, one line each: ``where: field.path: what was wrong``."""
    lines = []
    for error in errors:
        path = field_path(list(error.loc))
        name = ".".join(str(part) for part in path) or "(the spec)"
        where = spec.where(path) if spec is not None else "spec"
        lines.append(f"{where}: {name}: {error.msg}")
    return lines
