"""``X-Request-ID`` on every response: the caller's own id when it sent a sane one, else a fresh uuid4 hex.

A pure ASGI middleware (not BaseHTTPMiddleware, which buffers and breaks streamed responses such as a followed
log): it only adds a header to the ``http.response.start`` message and passes every body chunk straight on.
The id is also set in ``orchestrator.request_context.request_id`` for the length of the request, so log
records can name it.
"""

from __future__ import annotations

import logging
import re
import uuid

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from orchestrator.request_context import ENTITIES, request_id

log = logging.getLogger(__name__)

HEADER = "X-Request-ID"
MAX_LENGTH = 128
# Letters, digits and a few separators: enough for uuids, ULIDs and "svc-1234.5" style ids; nothing that could
# split a header or a log line, or smuggle markup into one.
_SANE = re.compile(rf"[A-Za-z0-9._:\-]{{1,{MAX_LENGTH}}}")


def accepted_id(sent: str | None) -> str:
    """The caller's id if it is sane, else a new one."""
    if sent is not None and _SANE.fullmatch(sent):
        return sent
    return uuid.uuid4().hex


class RequestId:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        sent = next((v for k, v in scope["headers"] if k == b"x-request-id"), None)
        rid = accepted_id(sent.decode("latin-1") if sent is not None else None)
        scope.setdefault("state", {})["request_id"] = rid

        started = False

        async def send_with_id(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                MutableHeaders(scope=message)[HEADER] = rid
            await send(message)

        token = request_id.set(rid)
        # The entity ids a route binds (api/log_context.py) last as long as the request, no longer.
        entity_tokens = [(var, var.set(None)) for var in ENTITIES.values()]
        try:
            await self.app(scope, receive, send_with_id)
        except Exception:
            # An unexpected error: Starlette's outermost middleware would answer a bare 500 without the id,
            # the one thing that lets the caller and the operator find it in the server's log. Answer it here
            # (the outer middleware sees a response already started and only re-raises, which logs it).
            log.exception("request %s (%s %s) failed", rid, scope.get("method"), scope.get("path"))
            if not started:
                await send_with_id(_internal_error_start())
                await send_with_id({"type": "http.response.body", "body": _INTERNAL_ERROR_BODY})
            raise
        finally:
            for var, entity_token in reversed(entity_tokens):
                var.reset(entity_token)
            request_id.reset(token)


_INTERNAL_ERROR_BODY = b'{"detail":"internal server error"}'


def _internal_error_start() -> Message:
    return {
        "type": "http.response.start",
        "status": 500,
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(_INTERNAL_ERROR_BODY)).encode()),
        ],
    }
