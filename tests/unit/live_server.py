"""The unit-test app (fake cluster, SQLite) served over real HTTP by uvicorn in a thread: what the SDK and the
CLI talk to in the unit tests. ``tick``/``reconcile`` (``tests.unit.api_helpers``) drive its loops by hand, and
``backend`` (a ``FakeBackend``) plays the cluster."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import uvicorn
from fastapi import FastAPI

from api.app import create_app
from orchestrator.settings import Settings
from tests.conftest import free_port
from tests.fakes import FakeBackend
from tests.unit.api_helpers import ADMIN


@dataclass
class LiveServer:
    url: str
    app: FastAPI
    backend: FakeBackend
    admin_token: str = ADMIN


def serve(tmp_path: Path, backend: FakeBackend, **overrides):
    """A context manager: yields a ``LiveServer`` whose uvicorn answers on 127.0.0.1, stops it after."""
    defaults = {
        "database_url": f"sqlite:///{tmp_path / 'orchestrator.db'}",
        "storage": str(tmp_path / "storage"),
        "var_dir": str(tmp_path / "var"),
        "admin_token": ADMIN,
        "workload_packages": "allowed_pkg",
    }
    settings = Settings(**{**defaults, **overrides})  # a test's settings_overrides win
    app = create_app(settings, backend=backend, run_loops=False)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)

    class _Serving:
        def __enter__(self) -> LiveServer:
            thread.start()
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                try:
                    if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                        return LiveServer(url=url, app=app, backend=backend)
                except httpx.TransportError:
                    pass
                time.sleep(0.05)
            raise RuntimeError(f"uvicorn did not answer on {url} within 30 s")

        def __exit__(self, *exc) -> None:
            server.should_exit = True
            thread.join(timeout=30)

    return _Serving()


def serve_forever(root: Path, port: int, database_url: str) -> None:
    """The unit-test app (fake cluster, no loops) on ``port`` until killed: one API replica of several on one
    database, in a process of its own (``python -m tests.unit.live_server ROOT PORT DATABASE_URL``)."""
    settings = Settings(
        database_url=database_url,
        storage=str(root / "storage"),
        var_dir=str(root / "var"),
        admin_token=ADMIN,
        workload_packages="allowed_pkg",
    )
    app = create_app(settings, backend=FakeBackend(), run_loops=False)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    import sys

    serve_forever(Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
