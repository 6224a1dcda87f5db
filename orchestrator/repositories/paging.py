"""Keyset paging for every list the API returns: one cursor scheme (the jobs' one, from the start).

A page is ordered by a few columns that together are unique (the last one an id); the cursor is the
url-safe base64 of the JSON list of the last row's values of those columns (datetimes in ISO 8601), so
``[created_at, id]`` for jobs. The next page is the rows strictly after it in that order.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import DateTime, Select, and_, or_
from sqlalchemy.orm import Session

from orchestrator.errors import Invalid


class InvalidCursor(Invalid):
    """422: a cursor this API did not make."""


def encode_cursor(values: Sequence[Any]) -> str:
    raw = json.dumps([v.isoformat() if isinstance(v, datetime) else v for v in values]).encode()
    return base64.urlsafe_b64encode(raw).decode()


def decode_cursor(cursor: str, columns: Sequence[Any]) -> list[Any]:
    try:
        values = json.loads(base64.urlsafe_b64decode(cursor.encode()))
        if not isinstance(values, list) or len(values) != len(columns):
            raise ValueError("wrong shape")
        return [_typed(v, c.type) for v, c in zip(values, columns, strict=True)]
    except (ValueError, TypeError, NotImplementedError, AttributeError) as exc:
        raise InvalidCursor("cursor is not one this API returned") from exc


def _typed(value: Any, column_type: Any) -> Any:
    if isinstance(column_type, DateTime) or isinstance(getattr(column_type, "impl", None), DateTime):
        return datetime.fromisoformat(value)
    python_type = column_type.python_type
    if not isinstance(value, python_type) or isinstance(value, bool):
        raise TypeError(f"{value!r} is not a {python_type.__name__}")
    return value


def fetch_page(
    session: Session, query: Select, columns: Sequence[Any], cursor: str | None, limit: int, descending: bool = False
) -> tuple[list[Any], str | None]:
    """The page of ``query`` ordered by ``columns`` (all ascending, or all descending) after ``cursor``,
    and the cursor of the next page (None on the last). InvalidCursor for a cursor this API did not make."""
    order = [c.desc() if descending else c.asc() for c in columns]
    query = query.order_by(*order).limit(limit + 1)
    if cursor:
        values = decode_cursor(cursor, columns)
        after = []
        for i, (column, value) in enumerate(zip(columns, values, strict=True)):
            beyond = column < value if descending else column > value
            after.append(and_(*[c == v for c, v in zip(columns[:i], values[:i], strict=True)], beyond))
        query = query.where(or_(*after))
        if len(columns) > 1:
            # Implied by the OR above, but stated on its own it bounds an index range scan on the first
            # column: without it PostgreSQL reads the index from the start, past every earlier page.
            query = query.where(columns[0] <= values[0] if descending else columns[0] >= values[0])
    rows = list(session.scalars(query))
    if len(rows) <= limit:
        return rows, None
    last = rows[limit - 1]
    return rows[:limit], encode_cursor([getattr(last, c.key) for c in columns])
