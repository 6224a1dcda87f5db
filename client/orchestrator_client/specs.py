"""Spec files and ``--set`` overrides, in one function the SDK's ``submit`` and the CLI share:
``load_spec(source, overrides=["epochs=3", "scaling.num_workers=2"])``.

A source is a dict, a pydantic model (the contract's ``JobSpec``...), or the path of a YAML or JSON file.
An override is ``dotted.path=value``; the value is read as a YAML scalar (``3`` is an int, ``true`` a bool,
``[1, 2]`` a list, ``null`` None, anything else a string), and missing mappings on the way are created.
Nothing is validated here: the server's 422 names the field, and the CLI points at it in the file.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

SPEC_SUFFIXES = (".yaml", ".yml", ".json")
_NUMBER = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+$")  # exponent forms PyYAML leaves as strings


class SpecError(ValueError):
    """A spec file that cannot be read or parsed, or an override that cannot apply; says which and where."""


def load_spec(source: Mapping[str, Any] | BaseModel | str | Path, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """The spec as a plain dict (a copy: ``source`` is never changed), with ``overrides`` applied in order."""
    if isinstance(source, BaseModel):
        spec = source.model_dump(mode="json", exclude_unset=True)
    elif isinstance(source, Mapping):
        spec = copy.deepcopy(dict(source))
    elif isinstance(source, str | Path):
        spec = read_spec_file(Path(source))
    else:
        raise TypeError(f"a spec is a dict, a pydantic model or a file path, not {type(source).__name__}")
    for override in overrides:
        apply_override(spec, override)
    return spec


def read_spec_file(path: Path) -> dict[str, Any]:
    """A YAML (``.yaml``/``.yml``) or JSON (``.json``) file's top-level mapping."""
    if path.suffix.lower() not in SPEC_SUFFIXES:
        raise SpecError(f"{path}: a spec file ends in .yaml, .yml or .json")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError(f"{path}: {exc.strerror or exc}") from exc
    try:
        data = json.loads(text) if path.suffix.lower() == ".json" else yaml.safe_load(text)
    except json.JSONDecodeError as exc:
        raise SpecError(f"{path}:{exc.lineno}:{exc.colno}: not JSON: {exc.msg}") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        raise SpecError(f"{path}{where}: not YAML: {getattr(exc, 'problem', None) or exc}") from exc
    if not isinstance(data, dict):
        raise SpecError(f"{path}: the spec must be a mapping of fields, not {type(data).__name__}")
    return data


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"scaling.num_workers=2"`` -> ``(["scaling", "num_workers"], 2)``."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise SpecError(f"override {text!r}: write key=value (a dotted key, e.g. scaling.num_workers=2)")
    path = key.split(".")
    if any(not part for part in path):
        raise SpecError(f"override {text!r}: the key {key!r} has an empty part")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw  # not a YAML value (e.g. an unbalanced bracket): the text as it is
    if isinstance(value, str) and value == raw.strip() and _NUMBER.match(value):  # unquoted
        value = float(value)  # YAML 1.1 reads 1e-3 (no dot) as a string; on a command line it is a number
    return path, value


def apply_override(spec: dict[str, Any], text: str) -> None:
    """Set one ``key=value`` in ``spec`` (in place). A list is indexed by a number (``callbacks.0.name=x``)."""
    path, value = parse_override(text)
    node: Any = spec
    for depth, part in enumerate(path[:-1]):
        node = _child(node, part, text, path[: depth + 1])
    last = path[-1]
    if isinstance(node, list):
        node[_index(node, last, text)] = value
    else:
        node[last] = value


def _child(node: Any, part: str, text: str, where: list[str]) -> Any:
    if isinstance(node, list):
        return node[_index(node, part, text)]
    if not isinstance(node, dict):
        raise SpecError(f"override {text!r}: {'.'.join(where[:-1])} is a {type(node).__name__}, not a mapping")
    child = node.get(part)
    if child is None:
        child = node[part] = {}
    elif not isinstance(child, dict | list):
        raise SpecError(f"override {text!r}: {'.'.join(where)} is {child!r}, not a mapping")
    return child


def _index(node: list, part: str, text: str) -> int:
    try:
        index = int(part)
        node[index]  # raises IndexError when out of range
    except (ValueError, IndexError):
        raise SpecError(f"override {text!r}: {part!r} is not an index of a list of {len(node)}") from None
    return index
