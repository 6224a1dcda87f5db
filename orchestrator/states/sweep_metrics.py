"""The state engine's metric hooks for sweeps: submitted, and finished by terminal state
(``orchestrator.metrics``), counted when the caller's transaction commits, never before (as
``orchestrator/states/job_metrics.py`` does for jobs). Sessions made outside a control plane count nothing.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from orchestrator.db.models import JobState
from orchestrator.metrics import after_commit, metrics_of
from orchestrator.states.core import Change

_TERMINAL = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


def count_submitted(session: Session, _change: Change) -> None:
    metrics = metrics_of(session)
    if metrics is not None:
        after_commit(session, metrics.sweeps_submitted.inc)


def count_change(session: Session, change: Change) -> None:
    metrics = metrics_of(session)
    if metrics is not None and change.to_state in _TERMINAL:
        after_commit(session, metrics.sweeps_finished.labels(change.to_state.value).inc)
