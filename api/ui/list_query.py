"""A list page's filters as a query string, so the links to the next page, the first page and the live JSON
keep what the user chose (one for the jobs, sweeps and deployments lists)."""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum
from urllib.parse import urlencode

DEFAULT_LIMIT = 50


def list_query(
    state: Iterable[Enum] | None,
    limit: int,
    cursor: str | None = None,
    *,
    label: Iterable[str] | None = None,
    name: str | None = None,
) -> str:
    params: list[tuple[str, str]] = [("state", s.value) for s in state or []]
    params += [("label", item) for item in label or []]
    if name:
        params.append(("name", name))
    if limit != DEFAULT_LIMIT:
        params.append(("limit", str(limit)))
    if cursor:
        params.append(("cursor", cursor))
    return urlencode(params)
