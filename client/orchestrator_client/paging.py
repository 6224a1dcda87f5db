"""Lists as lazy iterators over the server's cursor pages: a page is asked for only when the one before is
used up, and never more items than ``limit`` in all (the last request asks for only what is still wanted).
Every page is asked for in the API's one scheme (``?envelope=true``: ``{"items", "next_cursor"}``); a bare list,
what a server from before that scheme answers, is read too."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, TypeVar

from orchestrator_client.transport import Transport

T = TypeVar("T")
NEXT_CURSOR_HEADER = "X-Next-Cursor"
SAFE_PAGE_SIZE = 200  # the smallest maximum page size of any list route (api/paging.py's MAX_PAGE)


class Pager(Generic[T]):
    """Iterate it (``for job in pager``, ``list(pager)``); it can be iterated once. ``pages`` counts the
    requests made so far. ``page_size`` None: the server's default page size."""

    def __init__(
        self,
        transport: Transport,
        path: str,
        parse: Callable[[Any], T],
        *,
        params: Mapping[str, Any] | list[tuple[str, Any]] | None = None,
        limit: int | None = None,
        page_size: int | None = None,
    ) -> None:
        if limit is not None and limit < 0:
            raise ValueError("limit must be 0 or more")
        if page_size is not None and page_size < 1:
            raise ValueError("page_size must be 1 or more")
        self._transport = transport
        self._path = path
        self._parse = parse
        self._params = list(params.items()) if isinstance(params, Mapping) else list(params or [])
        self.limit = limit
        self.page_size = page_size
        self.pages = 0
        self._items = self._iterate()

    def __iter__(self) -> Iterator[T]:
        return self._items

    def __next__(self) -> T:
        return next(self._items)

    def first(self) -> T | None:
        """The first item, or None (one small request)."""
        if self.limit is None or self.limit > 1:
            self.limit = 1
        return next(self._items, None)

    def _iterate(self) -> Iterator[T]:
        cursor: str | None = None
        yielded = 0
        while self.limit is None or yielded < self.limit:
            size = self.page_size
            if self.limit is not None:  # ask for no more than is still wanted (within every route's maximum)
                size = min(size or SAFE_PAGE_SIZE, self.limit - yielded)
            params = [*self._params, ("envelope", "true"), ("limit", size), ("cursor", cursor)]
            response = self._transport.request("GET", self._path, params=params)
            self.pages += 1
            body = response.json()
            items = body["items"] if isinstance(body, dict) else body  # the envelope, or an older server's list
            for item in items:
                yield self._parse(item)
                yielded += 1
                if self.limit is not None and yielded >= self.limit:
                    return
            cursor = response.headers.get(NEXT_CURSOR_HEADER) or (
                body.get("next_cursor") if isinstance(body, dict) else None
            )
            if not cursor or not items:
                return
