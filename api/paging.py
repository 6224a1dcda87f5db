"""Paging for every list route, in one place: ``?limit=`` (at most a maximum page size; by default the
maximum, so a caller that reads a short list whole still gets it in one answer) and ``?cursor=``. The body
stays what it was (a JSON list); the next page's cursor is the ``X-Next-Cursor`` response header, absent on
the last page. ``GET /v1/jobs`` keeps its ``{"items", "next_cursor"}`` body and sends the header too.

The cursor scheme is the jobs' (``orchestrator.repositories.paging``); a cursor this API did not make is a 422.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Query, Response

MAX_PAGE = 200  # items per page of a list route, at most (and by default)
MAX_METRICS_PAGE = 1000  # a job's or a trial's metric points: many small rows
NEXT_CURSOR_HEADER = "X-Next-Cursor"

T = TypeVar("T")


@dataclass(frozen=True)
class PageParams:
    cursor: str | None
    limit: int
    response: Response

    def fetch(self, fetch_page: Callable[[str | None, int], tuple[list[T], str | None]]) -> list[T]:
        """Run ``fetch_page(cursor, limit)`` (a repository's ``page_*``), put the next cursor in the header.
        A cursor this API did not make raises ``InvalidCursor`` (an ``Invalid``: 422)."""
        rows, next_cursor = fetch_page(self.cursor, self.limit)
        if next_cursor is not None:
            self.response.headers[NEXT_CURSOR_HEADER] = next_cursor
        return rows


def _params(max_size: int, default: int | None = None) -> Any:
    async def params(  # no I/O: async, so FastAPI does not hand it to a thread (api/deps.py)
        response: Response,
        cursor: Annotated[
            str | None, Query(max_length=512, description=f"The {NEXT_CURSOR_HEADER} header of the page before.")
        ] = None,
        limit: Annotated[int, Query(ge=1, le=max_size, description=f"Items per page, at most {max_size}.")] = (
            default or max_size
        ),
    ) -> PageParams:
        return PageParams(cursor, limit, response)

    return Annotated[PageParams, Depends(params)]


Page = _params(MAX_PAGE)
MetricsPage = _params(MAX_METRICS_PAGE)
JobsPage = _params(MAX_PAGE, default=50)  # GET /v1/jobs: its default since the start
