"""Polling until something is done, in one place: the ``wait`` of jobs, sweeps and deployments."""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from typing import TypeVar

from orchestrator_client.errors import WaitTimeout

T = TypeVar("T")


def poll_until(
    obj: T,
    reload: Callable[[], T],
    done: Callable[[T], bool],
    *,
    timeout: float | None,
    poll: float,
    what: Callable[[T], str],
    on_change: Callable[[T], None] | None = None,
    change_key: Callable[[T], Hashable] | None = None,
) -> T:
    """Reload ``obj`` every ``poll`` seconds until ``done(obj)``; returns it. ``on_change(obj)`` is called first
    and then whenever ``change_key(obj)`` changes (a state, a reason). Past ``timeout`` seconds: WaitTimeout
    whose ``last`` is the object as last seen, and whose message says where it was (``what(obj)``)."""
    if poll <= 0:
        raise ValueError("poll must be more than 0 seconds")
    deadline = None if timeout is None else time.monotonic() + timeout
    seen: object = object()
    obj = reload()
    while True:
        key = change_key(obj) if change_key else None
        if on_change is not None and key != seen:
            on_change(obj)
        seen = key
        if done(obj):
            return obj
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            raise WaitTimeout(f"still {what(obj)} after {timeout:g} s", last=obj)
        time.sleep(poll if deadline is None else max(0.0, min(poll, deadline - now)))
        obj = reload()
