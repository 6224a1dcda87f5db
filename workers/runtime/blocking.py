"""The seconds checkpoints blocked training, for goodput (docs/jobs.md "Goodput"): the built-in loop and a training
function's context both time their checkpoints here and send the sum with their next metric point."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

from orchestrator_contract.jobs import MetricsEvent


class CheckpointBlocking:
    """Seconds checkpoints blocked training since the last metric point took them."""

    def __init__(self) -> None:
        self.seconds = 0.0

    @contextlib.contextmanager
    def timed(self) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds += time.perf_counter() - started

    def take(self) -> float | None:
        """The seconds since the last take (None when none), for ``MetricsEvent.checkpoint_blocked_s``."""
        seconds, self.seconds = self.seconds, 0.0
        return seconds or None

    def flush(self, reporter: Any, epoch: int, step: int) -> None:
        """At the end: the last checkpoint's seconds in a point of their own, with no values, at the last step (it
        merges into that step's point)."""
        seconds = self.take()
        if reporter is not None and seconds:
            reporter.emit(MetricsEvent(epoch=epoch, step=step, values={}, checkpoint_blocked_s=seconds))
