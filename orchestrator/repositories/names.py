"""Filtering rows by the start of their name, the same way for every kind (jobs, sweeps)."""

from __future__ import annotations

from sqlalchemy import ColumnElement, and_, func
from sqlalchemy.orm import InstrumentedAttribute

# Names are at most 128 characters (orchestrator_contract): a longer prefix matches nothing, and is refused instead.
MAX_NAME_PREFIX = 128


def name_starts_with(column: InstrumentedAttribute[str], prefix: str) -> ColumnElement[bool]:
    """``column`` starts with ``prefix``, taken literally and case-sensitively on every database.

    LIKE (with ``%``, ``_`` and the escape character escaped) lets PostgreSQL use an index; SQLite's LIKE
    ignores ASCII case, so the exact comparison of the first characters keeps "Digits" from matching "digits".
    """
    return and_(column.startswith(prefix, autoescape=True), func.substr(column, 1, len(prefix)) == prefix)
