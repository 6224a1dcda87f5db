"""Live updates, one mechanism for every page: the page polls a /ui/api JSON route with If-None-Match; the
answer carries an ETag, and an unchanged answer is a bodiless 304 (static/live.js does the polling and
hands new data to the page's code, which updates what is on screen in place)."""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from typing import Any

from fastapi import Request, Response
from fastapi.encoders import jsonable_encoder

POLL_MS = 2000  # how often the pages poll (the client backs off while the tab is hidden)


def etag_of(*parts: Any) -> str:
    digest = hashlib.sha256(json.dumps(parts, default=str, separators=(",", ":")).encode()).hexdigest()
    return f'W/"{digest[:32]}"'


def not_modified(request: Request, etag: str) -> Response | None:
    """A 304 when the client already has ``etag`` (checked before the answer is built, when it is cheap)."""
    if etag in [t.strip() for t in request.headers.get("if-none-match", "").split(",")]:
        return Response(status_code=304, headers={"ETag": etag, "Cache-Control": "no-cache"})
    return None


def json_body(payload: Any) -> bytes:
    return json.dumps(jsonable_encoder(payload), separators=(",", ":")).encode()


def json_answer(request: Request, payload: Any, etag: str | None = None, body: bytes | None = None) -> Response:
    """``payload`` (or its ready ``body``) as JSON with an ETag (its content's, unless given); a 304 when the
    client has it."""
    body = json_body(payload) if body is None else body
    etag = etag or f'W/"{hashlib.sha256(body).hexdigest()[:32]}"'
    return not_modified(request, etag) or Response(
        body,
        media_type="application/json",
        headers={"ETag": etag, "Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"},
    )


class AnswerCache:
    """The last few expensive answers by ETag, shared by every viewer (a job's curves: several people, or one
    reload, ask for the same). Only consulted after the caller's access check, so it never widens access."""

    def __init__(self, size: int = 16) -> None:
        self._size = size
        self._answers: OrderedDict[str, bytes] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, etag: str) -> bytes | None:
        with self._lock:
            body = self._answers.get(etag)
            if body is not None:
                self._answers.move_to_end(etag)
            return body

    def clear(self) -> None:
        with self._lock:
            self._answers.clear()

    def put(self, etag: str, body: bytes) -> None:
        with self._lock:
            self._answers[etag] = body
            self._answers.move_to_end(etag)
            while len(self._answers) > self._size:
                self._answers.popitem(last=False)
