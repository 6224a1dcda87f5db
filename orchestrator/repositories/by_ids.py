"""Reading rows for many ids at once without a query per id, through the column's index on both databases."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import ColumnElement, Select, String, any_, bindparam
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Session

SQLITE_CHUNK = 500  # ids in one IN list (SQLite's default limit on parameters is far above)


def rows_for_ids(session: Session, query: Callable[[ColumnElement[bool]], Select], column, ids: list[str]) -> list[Any]:
    """The rows of ``query(condition)`` where ``condition`` says ``column`` is one of ``ids``: on PostgreSQL one
    ``= ANY(array)`` (one parameter however many ids, and the planner reads the index for it), elsewhere IN
    lists of ``SQLITE_CHUNK``. Rows in the order of each query; the caller orders across chunks if it needs to."""
    if not ids:
        return []
    if session.get_bind().dialect.name == "postgresql":
        return list(session.execute(query(column == any_(bindparam("ids", ids, type_=ARRAY(String))))))
    out: list[Any] = []
    for i in range(0, len(ids), SQLITE_CHUNK):
        out.extend(session.execute(query(column.in_(ids[i : i + SQLITE_CHUNK]))))
    return out
