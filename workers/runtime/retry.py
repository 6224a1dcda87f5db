"""The one retry policy of the code on the cluster: how a driver and an event reporter wait for a control plane
that is away (restarting, overloaded), built on tenacity.

Each wait is exponential in the number of failures and jittered: ``first_delay_s * 2**n`` times a random factor
in [0.5, 1.5), capped at ``cap_s``, so every wait lies in [0, cap_s]. Without the jitter every worker of every
job retries in lockstep after a control plane restart, and they all arrive at once, again and again. The
jitter spreads them over a window as wide as the step itself while keeping the average wait of the plain
exponential loop this replaced, so a caller still rides out the same outage as before. Each policy draws
from its own random generator, seeded from the OS (``os.urandom``), never from a seed a forked process would
share.

A policy is bounded by ``max_tries`` (calls in all, the first one included), by ``deadline_s`` (no wait
begins that would end past that many seconds after the first call) and by a ``stop`` event (a wait ends at
once when it is set, and nothing more is tried); with none of them it retries until it succeeds. Only the
exceptions in ``retry_on`` are retried: any other is raised at once, after one call.

HTTP: ``raise_if_retryable`` turns an answer worth trying again (5xx, 408, 429; anything but a 2xx or a 4xx,
such as a proxy's redirect while the control plane restarts) into ``RetryableStatus``; every other 4xx (a
refused token, an unknown job, a batch the server will never accept) is for the caller to raise or drop,
never to retry.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import httpx
import tenacity

T = TypeVar("T")

log = logging.getLogger(__name__)

# 408 and 429 mean "try again later"; every other 4xx says the request itself is unacceptable.
RETRYABLE_4XX = frozenset({408, 429})
JITTER = (0.5, 1.5)  # the factor each exponential step is multiplied by: the same mean, a window as wide


def is_retryable_status(status_code: int) -> bool:
    """Neither a success (2xx) nor a refusal (a 4xx but 408 and 429): the same request may succeed later."""
    refused = 400 <= status_code < 500 and status_code not in RETRYABLE_4XX
    return not (200 <= status_code < 300 or refused)


class RetryableStatus(Exception):
    """An HTTP answer that may be different next time (see ``is_retryable_status``)."""

    def __init__(self, response: httpx.Response):
        super().__init__(f"HTTP {response.status_code}")
        self.response = response


class Stopped(Exception):
    """The caller's stop event was set during a wait: nothing more is tried."""


def raise_if_retryable(response: httpx.Response) -> httpx.Response:
    """``response``, unless it is worth trying again: then ``RetryableStatus``."""
    if is_retryable_status(response.status_code):
        raise RetryableStatus(response)
    return response


@dataclass(frozen=True)
class RetryPolicy:
    """Jittered exponential waits in [0, ``cap_s``], bounded by ``max_tries`` and / or ``deadline_s`` (None:
    no bound of that kind). See the module's docstring."""

    first_delay_s: float
    cap_s: float
    max_tries: int | None = None
    deadline_s: float | None = None
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not 0 <= self.first_delay_s <= self.cap_s:
            raise ValueError(f"need 0 <= first_delay_s <= cap_s, got {self.first_delay_s} and {self.cap_s}")
        if self.max_tries is not None and self.max_tries < 1:
            raise ValueError(f"max_tries must be at least 1, got {self.max_tries}")

    def delay(self, failures: int) -> float:
        """The wait after the ``failures``-th failure in a row (1 for the first), in [0, cap_s]."""
        step = self.first_delay_s * 2 ** min(failures - 1, 62)  # the exponent is capped: no float overflow
        return min(self.cap_s, step * self.rng.uniform(*JITTER))

    def call(
        self,
        attempt: Callable[[], T],
        *,
        retry_on: tuple[type[BaseException], ...],
        what: str,
        stop: threading.Event | None = None,
        logger: logging.Logger = log,
        sleep: Callable[[float], None] = time.sleep,
    ) -> T:
        """``attempt()``'s result, calling it again after each exception in ``retry_on`` until it returns or
        a bound is reached; then the last exception is raised (``Stopped`` when ``stop`` ended a wait).
        ``what`` names the action in the warning logged before each wait."""
        bounds: list[tenacity.stop.stop_base] = []
        if self.max_tries is not None:
            bounds.append(tenacity.stop_after_attempt(self.max_tries))
        if self.deadline_s is not None:
            bounds.append(tenacity.stop_before_delay(self.deadline_s))
        if stop is not None:
            if stop.is_set():
                raise Stopped(what)
            sleep = _interruptible(stop, what)

        def warn(state: tenacity.RetryCallState) -> None:
            problem = state.outcome.exception() if state.outcome else None
            logger.warning(
                "%s failed (%s: %s); try %d in %.1fs",
                what,
                type(problem).__name__,
                problem,
                state.attempt_number + 1,
                state.upcoming_sleep,
            )

        retrying = tenacity.Retrying(
            wait=lambda state: self.delay(state.attempt_number),
            stop=tenacity.stop_any(*bounds) if bounds else tenacity.stop_never,
            retry=tenacity.retry_if_exception_type(retry_on),
            sleep=sleep,
            before_sleep=warn,
            reraise=True,
        )
        return retrying(attempt)


def _interruptible(stop: threading.Event, what: str) -> Callable[[float], None]:
    def sleep(seconds: float) -> None:
        if stop.wait(seconds):
            raise Stopped(what)

    return sleep
