"""The one retry policy of the drivers and the event reporter (``workers.runtime.retry``): jittered waits within their
cap, bounded tries and deadline, no retry of what waiting will not fix, a stop event
(docs/architecture.md, "What runs where")."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from workers.runtime.retry import (
    JITTER,
    RetryableStatus,
    RetryPolicy,
    Stopped,
    is_retryable_status,
    raise_if_retryable,
)


class Flaky:
    """Raises ``error`` for the first ``failures`` calls, then returns "done"; counts the calls."""

    def __init__(self, failures: int, error: BaseException | None = None) -> None:
        self.failures = failures
        self.error = error or ConnectionError("control plane away")
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return "done"


def test_waits_are_jittered_and_within_the_cap():
    first, second = RetryPolicy(0.5, 10.0), RetryPolicy(0.5, 10.0)
    waits = [[policy.delay(failures) for failures in range(1, 21)] for policy in (first, second)]
    assert waits[0] != waits[1]  # no seed given: two workers never wait in lockstep
    for policy_waits in waits:
        assert all(0 <= wait <= 10.0 for wait in policy_waits)
        assert len(set(policy_waits[:4])) == 4
    # Before the cap each wait lies within the jitter's window around the exponential step.
    for failures, wait in enumerate(waits[0][:4], start=1):
        step = 0.5 * 2 ** (failures - 1)
        assert JITTER[0] * step <= wait <= JITTER[1] * step


def test_one_step_is_spread_over_a_window():
    policy = RetryPolicy(1.0, 10.0)
    waits = [policy.delay(1) for _ in range(200)]
    assert max(waits) - min(waits) > 0.5  # 200 workers after one restart do not all come back at once


def test_a_wait_never_exceeds_the_cap_after_many_failures():
    policy = RetryPolicy(0.5, 10.0)
    assert all(0 <= policy.delay(failures) <= 10.0 for failures in (10, 100, 10_000))


def test_the_tries_are_bounded_and_the_last_error_is_raised():
    attempt, waits = Flaky(failures=100), []
    policy = RetryPolicy(1.0, 10.0, max_tries=5)
    with pytest.raises(ConnectionError, match="control plane away"):
        policy.call(attempt, retry_on=(ConnectionError,), what="test", sleep=waits.append)
    assert attempt.calls == 5
    assert len(waits) == 4 and all(0 <= wait <= 10.0 for wait in waits)


def test_the_deadline_is_bounded():
    attempt = Flaky(failures=10_000)
    policy = RetryPolicy(0.01, 0.02, deadline_s=0.3)
    started = time.monotonic()
    with pytest.raises(ConnectionError):
        policy.call(attempt, retry_on=(ConnectionError,), what="test")
    assert time.monotonic() - started < 0.3 + 1.0  # no wait starts that would end past it (slack: a busy CI)
    assert attempt.calls > 2


def test_success_after_failures_returns_the_result():
    attempt, waits = Flaky(failures=3), []
    assert RetryPolicy(1.0, 10.0, max_tries=5).call(attempt, retry_on=(ConnectionError,), what="t", sleep=waits.append)
    assert attempt.calls == 4 and len(waits) == 3


def test_a_non_retryable_error_is_raised_at_once():
    attempt, waits = Flaky(failures=1, error=PermissionError("token refused")), []
    with pytest.raises(PermissionError):
        RetryPolicy(1.0, 10.0).call(attempt, retry_on=(ConnectionError,), what="test", sleep=waits.append)
    assert attempt.calls == 1 and waits == []


def test_a_stop_event_ends_a_wait_at_once():
    stop = threading.Event()
    attempt = Flaky(failures=10_000)
    threading.Timer(0.1, stop.set).start()
    started = time.monotonic()
    with pytest.raises(Stopped):
        RetryPolicy(30.0, 30.0).call(attempt, retry_on=(ConnectionError,), what="test", stop=stop)
    assert time.monotonic() - started < 5
    assert attempt.calls == 1


def test_a_set_stop_event_tries_nothing():
    stop = threading.Event()
    stop.set()
    attempt = Flaky(failures=0)
    with pytest.raises(Stopped):
        RetryPolicy(1.0, 10.0).call(attempt, retry_on=(ConnectionError,), what="test", stop=stop)
    assert attempt.calls == 0


@pytest.mark.parametrize("status", [500, 502, 503, 504, 408, 429, 302])
def test_statuses_worth_another_try(status):
    assert is_retryable_status(status)
    response = httpx.Response(status)
    with pytest.raises(RetryableStatus):
        raise_if_retryable(response)


@pytest.mark.parametrize("status", [200, 201, 400, 401, 403, 404, 409, 413, 422])
def test_statuses_that_waiting_will_not_fix(status):
    """A refused token (401/403) or a request the server will never take is not retried, ever."""
    assert not is_retryable_status(status)
    response = httpx.Response(status)
    assert raise_if_retryable(response) is response


def test_bad_bounds_are_refused():
    with pytest.raises(ValueError, match="first_delay_s <= cap_s"):
        RetryPolicy(10.0, 1.0)
    with pytest.raises(ValueError, match="max_tries"):
        RetryPolicy(1.0, 10.0, max_tries=0)
