"""Paging for every list route, in one place: ``?limit=``, ``?cursor=`` and, the one scheme,
``?envelope=true``: the body is ``{"items", "next_cursor"}`` (``orchestrator_contract.rest.Paged``), 50 items a
page by default (metric points: 1,000). ``GET /v1/jobs`` answers that way always. Every list also sends the next
page's cursor as the ``X-Next-Cursor`` response header (absent on the last page).

Without ``envelope`` a list answers as it did before the one scheme: a bare JSON list, at most and by default
the route's maximum, with a ``Deprecation`` header (RFC 9745) saying since when that shape is deprecated
(docs/getting-started.md, "Paging"). It keeps working for existing callers.

The cursor scheme is the jobs' (``orchestrator.repositories.paging``); a cursor this API did not make is a 422.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Query, Response

from orchestrator_contract.rest import Paged

MAX_PAGE = 200  # items per page of a list route, at most
MAX_METRICS_PAGE = 1000  # a job's or a trial's metric points: many small rows
ENVELOPE_PAGE = 50  # items per page by default in the envelope
NEXT_CURSOR_HEADER = "X-Next-Cursor"
# The bare-list shape is deprecated since the envelope came to every list (2026-11-28, as RFC 9745's @seconds).
BARE_LIST_DEPRECATED = "@1795824000"

T = TypeVar("T")


@dataclass(frozen=True)
class PageParams:
    cursor: str | None
    limit: int
    envelope: bool
    response: Response

    def fetch(self, fetch_page: Callable[[str | None, int], tuple[list[T], str | None]]) -> list[T]:
        """Run ``fetch_page(cursor, limit)`` (a repository's ``page_*``), put the next cursor in the header.
        A cursor this API did not make raises ``InvalidCursor`` (an ``Invalid``: 422)."""
        rows, next_cursor = fetch_page(self.cursor, self.limit)
        if next_cursor is not None:
            self.response.headers[NEXT_CURSOR_HEADER] = next_cursor
        return rows

    def answer(self, items: list[T]) -> list[T] | Paged[T]:
        """The page as the caller asked for it: the envelope, or the deprecated bare list."""
        if self.envelope:
            return Paged[Any](items=items, next_cursor=self.response.headers.get(NEXT_CURSOR_HEADER))
        self.response.headers["Deprecation"] = BARE_LIST_DEPRECATED
        return items


def _params(max_size: int, envelope_default: int, always_envelope: bool = False) -> Any:
    bare_default = envelope_default if always_envelope else max_size

    async def params(  # no I/O: async, so FastAPI does not hand it to a thread (api/deps.py)
        response: Response,
        cursor: Annotated[
            str | None, Query(max_length=512, description=f"The {NEXT_CURSOR_HEADER} header of the page before.")
        ] = None,
        limit: Annotated[
            int | None,
            Query(
                ge=1,
                le=max_size,
                description=f"Items per page, at most {max_size} (default {envelope_default} in the envelope"
                + ("" if always_envelope else f", {max_size} in the deprecated bare list")
                + ").",
            ),
        ] = None,
        envelope: Annotated[
            bool,
            Query(
                description='`true`: the body is `{"items", "next_cursor"}`, as every list answers; without it, '
                "a bare list (deprecated: a `Deprecation` header says so)."
                if not always_envelope
                else "Always `true` here (the body is the envelope).",
            ),
        ] = always_envelope,
    ) -> PageParams:
        wrapped = envelope or always_envelope
        return PageParams(cursor, limit or (envelope_default if wrapped else bare_default), wrapped, response)

    return Annotated[PageParams, Depends(params)]


Page = _params(MAX_PAGE, ENVELOPE_PAGE)
MetricsPage = _params(MAX_METRICS_PAGE, MAX_METRICS_PAGE)
JobsPage = _params(MAX_PAGE, ENVELOPE_PAGE, always_envelope=True)  # GET /v1/jobs: the envelope since the start
