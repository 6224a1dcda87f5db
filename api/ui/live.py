"""Live updates, one mechanism for every page: the page polls a /ui/api JSON route with If-None-Match; the
answer carries an ETag, and an unchanged answer is a bodiless 304 (static/live.js does the polling and
hands new data to the page's code, which updates what is on screen in place)."""

from __future__ import annotations

import hashlib
import json
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


def json_answer(request: Request, payload: Any, etag: str | None = None) -> Response:
    """``payload`` as JSON with an ETag (its content's, unless given); a 304 when the client has it."""
    body = json.dumps(jsonable_encoder(payload), separators=(",", ":")).encode()
    etag = etag or f'W/"{hashlib.sha256(body).hexdigest()[:32]}"'
    return not_modified(request, etag) or Response(
        body,
        media_type="application/json",
        headers={"ETag": etag, "Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"},
    )
