"""One page of any list route, as every list answers with ``?envelope=true`` (and ``GET /v1/jobs`` always):
``{"items": [...], "next_cursor": "..." | null}``."""

from __future__ import annotations

from typing import Generic, TypeVar

from pydantic import BaseModel, Field

T = TypeVar("T")


class Paged(BaseModel, Generic[T]):
    """One page: its items in the list's order, and the cursor of the next page."""

    items: list[T] = Field(description="This page's items, in the list's order.")
    next_cursor: str | None = Field(description="Pass as ?cursor= for the next page; null on the last.")
