"""The cluster backend: the only way the control plane talks to Ray.

This module holds the interface and plain types (no ray import); ``ray_backend`` implements it and
``local_cluster`` starts the local Ray head that ``make run`` uses.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol

from orchestrator.admission import ClusterCapacity


class RunStatus(enum.StrEnum):
    """Ray Jobs' statuses, plus MISSING for a submission Ray no longer knows."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    STOPPED = "STOPPED"
    MISSING = "MISSING"

    @property
    def finished(self) -> bool:
        return self in (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.STOPPED, RunStatus.MISSING)


@dataclass(frozen=True)
class RunInfo:
    status: RunStatus
    message: str = ""


class BackendUnavailable(Exception):
    """The cluster could not be reached; callers retry on their next tick."""


class ClusterBackend(Protocol):
    def capacity(self) -> ClusterCapacity: ...

    def submit(self, submission_id: str, entrypoint: str, env_vars: dict[str, str], metadata: dict[str, str]) -> None:
        """Start a driver. Submitting an id that already exists is a no-op, never a second copy."""

    def info(self, submission_id: str) -> RunInfo: ...

    def stop(self, submission_id: str) -> None:
        """Ask the run to stop; a run that is gone or finished is fine."""

    def logs(self, submission_id: str) -> str | None:
        """The driver's output (Ray forwards worker output into it); None when Ray has none."""
