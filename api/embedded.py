"""Run the real service on a real port inside this process: for tests and benchmarks."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn

from api.app import create_app
from orchestrator.backend import ClusterBackend
from orchestrator.settings import Settings


@contextmanager
def serve_in_thread(settings: Settings, backend: ClusterBackend, start_timeout_s: float = 60) -> Iterator[str]:
    """Yields the service's base URL; stops it (loops, database) on exit."""
    app = create_app(settings, backend=backend)
    server = uvicorn.Server(uvicorn.Config(app, host=settings.host, port=settings.port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="service", daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout_s
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the service did not start")
        time.sleep(0.1)
    try:
        yield f"http://{settings.host}:{settings.port}"
    finally:
        server.should_exit = True
        thread.join(30)
