"""Every call the control plane makes to the cluster backend, counted by method and outcome in one place:
the ControlPlane wraps whichever backend it has (Ray's, or a test's fake) in a ``MeteredBackend``.

Outcomes: ``ok``; ``unavailable`` (BackendUnavailable: Ray could not be reached); ``rejected``
(ServeConfigRejected: Serve refused a config); ``error`` (anything else, a bug or a surprise from Ray).
"""

from __future__ import annotations

import functools
from typing import Any

from prometheus_client import Counter

from orchestrator.backend import BackendUnavailable, ClusterBackend, ServeConfigRejected

# The ClusterBackend interface's methods: the label values of ``method``, a fixed set.
METHODS = frozenset(
    {
        "capacity",
        "live_jobs",
        "submit",
        "info",
        "stop",
        "forget",
        "logs",
        "upload_package",
        "serve_status",
        "apply_serve",
    }
)


class MeteredBackend:
    def __init__(self, inner: ClusterBackend, calls: Counter):
        self.inner = inner
        self._calls = calls
        for method in METHODS:  # every series exists from the start, so a rate() sees the first failure
            for outcome in ("ok", "unavailable", "error"):
                calls.labels(method, outcome)

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self.inner, name)
        if name not in METHODS:
            return attribute

        @functools.wraps(attribute)
        def counted(*args, **kwargs):
            outcome = "error"
            try:
                result = attribute(*args, **kwargs)
                outcome = "ok"
                return result
            except BackendUnavailable:
                outcome = "unavailable"
                raise
            except ServeConfigRejected:
                outcome = "rejected"
                raise
            finally:
                self._calls.labels(name, outcome).inc()

        return counted
