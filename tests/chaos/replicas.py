"""Two control-plane replicas in front of one cluster: the address the drivers report to (what a Kubernetes
Service is to the replicas), and clients that record every answer they got, with when.

No pytest here: plain helpers for ``tests/chaos/test_leader_takeover.py``.
"""

from __future__ import annotations

import itertools
import socket
import threading
import time
from dataclasses import dataclass

import httpx


class FrontDoor:
    """A TCP forwarder on a port of its own: each connection goes to the next replica in turn that accepts it,
    so a replica that is gone (kill -9: its port refuses) is passed over, as a Service passes over a dead pod.
    Drivers and reporters are given this address (ORCHESTRATOR_PUBLIC_URL of both replicas)."""

    def __init__(self, ports: list[int]):
        self.ports = list(ports)
        self._turn = itertools.count()
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(256)
        self.port = self._listener.getsockname()[1]
        self._closed = threading.Event()
        threading.Thread(target=self._accept, name="front-door", daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self._closed.set()
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._forward, args=(client,), daemon=True).start()

    def _forward(self, client: socket.socket) -> None:
        first = next(self._turn)
        for i in range(len(self.ports)):
            try:
                upstream = socket.create_connection(("127.0.0.1", self.ports[(first + i) % len(self.ports)]), timeout=2)
                break
            except OSError:
                continue
        else:
            client.close()
            return
        upstream.settimeout(None)
        threading.Thread(target=_pipe, args=(upstream, client), daemon=True).start()
        _pipe(client, upstream)


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:  # either side gone: both connections end (the client sees a closed connection and retries)
        for sock in (source, sink):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()


@dataclass(frozen=True)
class Answer:
    started: float  # time.time() when the request was sent
    ended: float  # and when its answer (or error) came
    what: str
    status: int  # 0: no answer (a transport error)
    detail: str


class Recorder:
    """Threads that each call ``request(http, n)`` in a loop until stopped, recording every answer."""

    def __init__(self, base_url: str, headers: dict[str, str], calls: dict, threads: int = 1, pause_s: float = 0.2):
        self.base_url, self.headers, self.calls, self.pause_s = base_url, headers, calls, pause_s
        self.answers: list[Answer] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(threads)]

    def __enter__(self) -> Recorder:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)

    def _run(self, index: int) -> None:
        with httpx.Client(base_url=self.base_url, headers=self.headers, timeout=30) as http:
            for n in itertools.count():
                if self._stop.is_set():
                    return
                for what, call in self.calls.items():
                    started = time.time()
                    try:
                        response = call(http, f"{index}-{n}")
                        status, detail = response.status_code, response.text[:300]
                    except httpx.HTTPError as exc:
                        status, detail = 0, repr(exc)
                    with self._lock:
                        self.answers.append(Answer(started, time.time(), what, status, detail))
                time.sleep(self.pause_s)

    def failed(self, ok: set[int], until: float | None = None) -> list[Answer]:
        """The answers not in ``ok`` among those that ended before ``until`` (all of them without it)."""
        with self._lock:
            return [a for a in self.answers if a.status not in ok and (until is None or a.ended < until)]

    def between(self, start: float, end: float, what: str | None = None) -> list[Answer]:
        """Answers to requests sent at ``start`` or later that came back by ``end``."""
        with self._lock:
            return [a for a in self.answers if start <= a.started and a.ended <= end and what in (None, a.what)]
