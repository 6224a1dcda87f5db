"""HTTP request counts and latency (``orchestrator.metrics``), labelled by the route's TEMPLATE
(``/v1/jobs/{job_id}``), never the raw path, so a label set stays as small as the API itself.

A pure ASGI middleware, like ``api/request_id.py``: it counts a request as its answer starts (so a client
that has the answer sees it counted) and times the whole answer, a streamed body included. The template is
what FastAPI's router matched (it puts the route in the scope); a path no route matched is ``unmatched``.
"""

from __future__ import annotations

import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from orchestrator.metrics import Metrics

UNMATCHED = "unmatched"
# A client may send any method token: one outside these is counted as OTHER, so it cannot grow the label set.
KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
OTHER = "OTHER"


def route_template(scope: Scope) -> str:
    route = scope.get("route")
    return getattr(route, "path", None) or UNMATCHED


class HttpMetrics:
    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        method = scope["method"] if scope["method"] in KNOWN_METHODS else OTHER
        counted = False

        def count(status: int) -> None:
            nonlocal counted
            counted = True
            self.metrics.http_requests.labels(method, route_template(scope), f"{status // 100}xx").inc()

        async def send_counting(message: Message) -> None:
            # Counted as the answer starts, before the client can read it: counted at the end, a client that
            # reads the answer and then scrapes /metrics could race the count (seen in CI as one poll short).
            if message["type"] == "http.response.start" and not counted:
                count(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_counting)
        finally:
            if not counted:
                count(500)  # what an exception that escapes before any answer becomes (api/request_id.py answers it)
            self.metrics.http_duration.labels(method, route_template(scope)).observe(time.perf_counter() - started)
