"""A cap on request bodies, checked before anything parses them (a pure ASGI middleware: it never buffers)."""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

MB = 1024 * 1024


class BodyTooLarge(HTTPException):
    """Raised from ``receive`` once a streamed body passes the cap. A Starlette HTTPException, so FastAPI's
    body reading lets it through (any other error there would become a 400) and it answers 413."""

    def __init__(self, message: str) -> None:
        super().__init__(413, message)


class BodySizeLimit:
    """413 for a body over ``max_mb``: at once when Content-Length says so (not a byte is read), else as soon
    as the chunks received pass it. The answer names ``setting``. Paths under a prefix of ``larger`` get that
    prefix's (max_mb, setting) instead."""

    def __init__(self, app: ASGIApp, max_mb: float, setting: str, larger: dict[str, tuple[float, str]] | None = None):
        self.app = app
        self.max_mb = max_mb
        self.setting = setting
        self.larger = larger or {}

    def _limit(self, path: str) -> tuple[float, str]:
        for prefix, limit in self.larger.items():
            if path.startswith(prefix):
                return limit
        return self.max_mb, self.setting

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        max_mb, setting = self._limit(scope["path"])
        max_bytes = int(max_mb * MB)
        message = f"the request body is larger than {setting} ({max_mb:g} MB)"
        declared = next((v for k, v in scope["headers"] if k == b"content-length"), None)
        if declared is not None:
            try:
                too_big = int(declared) > max_bytes
            except ValueError:
                await JSONResponse({"detail": "invalid Content-Length header"}, status_code=400)(scope, receive, send)
                return
            if too_big:
                await _refuse(message, scope, receive, send)
                return

        received = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal received
            event = await receive()
            if event["type"] == "http.request":
                received += len(event.get("body", b""))
                if received > max_bytes:
                    raise BodyTooLarge(message)
            return event

        async def tracking_send(event: Message) -> None:
            nonlocal started
            if event["type"] == "http.response.start":
                started = True
            await send(event)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except BodyTooLarge:
            # Read outside FastAPI's request handling (which answers it itself): answer here if still possible.
            if started:
                raise
            await _refuse(message, scope, receive, send)


async def _refuse(message: str, scope: Scope, receive: Receive, send: Send) -> None:
    # Connection: close, so that a client still sending the rest of its body is not read any further.
    response = JSONResponse({"detail": message}, status_code=413, headers={"Connection": "close"})
    await response(scope, receive, send)
