"""Runs the scheduler, the reconcilers and the other loops in background threads of the API process."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from prometheus_client import Gauge

from orchestrator.leader import LeaseElector, fenced

log = logging.getLogger(__name__)


class Loop:
    """Calls ``tick`` every ``interval_s`` until stopped; an exception is logged, never fatal. A tick that
    ends without one sets ``last_success{loop=name}`` (orchestrator.metrics) to the time, so an operator
    can alert on a loop that stopped getting anything done.

    With several replicas (``orchestrator.leader``): a tick runs only while ``runs_now()`` says so (this replica
    leads), looked at again every ``IDLE_S`` meanwhile, and its commits are fenced by ``fence``'s token. Without
    them (SQLite, one process) it ticks as it always did."""

    IDLE_S = 0.2  # how soon a replica that was not leading looks again: an in-memory check
    WAKE_GAP_S = 0.05  # a woken loop waits this long first, so a burst of wakes makes one tick

    def __init__(
        self,
        name: str,
        tick: Callable[[], None],
        interval_s: float,
        last_success: Gauge | None = None,
        fence: LeaseElector | None = None,
        runs_now: Callable[[], bool] | None = None,
    ):
        self.name = name
        self.tick = tick
        self.interval_s = interval_s
        self.fence = fence
        self.runs_now = runs_now
        self._last_success = last_success.labels(name) if last_success is not None else None
        self._stop = threading.Event()
        self._wake = threading.Event()  # ``wake``: tick now rather than at the end of the interval
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if self.runs_now is not None and not self.runs_now():
                self._stop.wait(min(self.interval_s, self.IDLE_S))
                continue
            self.run_once()
            if self._wake.wait(self.interval_s):
                self._stop.wait(self.WAKE_GAP_S)  # a burst of submissions: one tick for them all
            self._wake.clear()

    def wake(self) -> None:
        """Tick now instead of at the end of the interval (the scheduler, on a submission: a run that fits is
        admitted at once, not up to ``scheduler_interval_s`` later). A follower's loop only looks sooner."""
        self._wake.set()

    def run_once(self) -> bool:
        """One tick; whether it succeeded."""
        try:
            with fenced(self.fence):
                self.tick()
        except Exception:
            log.exception("%s tick failed; trying again in %.1f s", self.name, self.interval_s)
            return False
        if self._last_success is not None:
            self._last_success.set(time.time())
        return True

    def stop(self, timeout_s: float = 10) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout_s)
