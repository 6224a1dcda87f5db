"""Runs the scheduler and the reconciler in background threads of the API process."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


class Loop:
    """Calls ``tick`` every ``interval_s`` until stopped; an exception is logged, never fatal."""

    def __init__(self, name: str, tick: Callable[[], None], interval_s: float):
        self.name = name
        self.tick = tick
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception:
                log.exception("%s tick failed; trying again in %.1f s", self.name, self.interval_s)
            self._stop.wait(self.interval_s)

    def stop(self, timeout_s: float = 10) -> None:
        self._stop.set()
        self._thread.join(timeout_s)
