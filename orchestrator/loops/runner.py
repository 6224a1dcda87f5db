"""Runs the scheduler, the reconcilers and the other loops in background threads of the API process."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from prometheus_client import Gauge

log = logging.getLogger(__name__)


class Loop:
    """Calls ``tick`` every ``interval_s`` until stopped; an exception is logged, never fatal. A tick that
    ends without one sets ``last_success{loop=name}`` (orchestrator.metrics) to the time, so an operator
    can alert on a loop that stopped getting anything done."""

    def __init__(self, name: str, tick: Callable[[], None], interval_s: float, last_success: Gauge | None = None):
        self.name = name
        self.tick = tick
        self.interval_s = interval_s
        self._last_success = last_success.labels(name) if last_success is not None else None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.run_once()
            self._stop.wait(self.interval_s)

    def run_once(self) -> bool:
        """One tick; whether it succeeded."""
        try:
            self.tick()
        except Exception:
            log.exception("%s tick failed; trying again in %.1f s", self.name, self.interval_s)
            return False
        if self._last_success is not None:
            self._last_success.set(time.time())
        return True

    def stop(self, timeout_s: float = 10) -> None:
        self._stop.set()
        self._thread.join(timeout_s)
