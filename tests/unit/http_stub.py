"""A tiny control plane over real HTTP for the workers' pollers (tests/unit/test_hangs.py,
tests/unit/test_trial_deadlines.py): subclass ``JsonHandler``, answer with ``answer``, run it with ``serving``."""

from __future__ import annotations

import contextlib
import http.server
import json
import threading
from collections.abc import Iterator


class JsonHandler(http.server.BaseHTTPRequestHandler):
    def answer(self, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def body(self) -> dict:
        """The request's JSON body."""
        return json.loads(self.rfile.read(int(self.headers["Content-Length"])))

    def log_message(self, *args) -> None:
        pass


@contextlib.contextmanager
def serving(handler: type[JsonHandler]) -> Iterator[str]:
    """``handler`` on a free local port, in a thread; yields its URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
