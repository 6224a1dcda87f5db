"""The state engine's metric hooks for jobs: what a job's changes add to the control plane's counters and
histograms (``orchestrator.metrics``), counted when the caller's transaction commits, never before, so a
change that is rolled back (a conflict, a retried event) counts nothing.

Sessions made outside a control plane (tests below the API, migrations) carry no registry: nothing counts.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from orchestrator.db.models import JobState
from orchestrator.metrics import after_commit, metrics_of
from orchestrator.states.core import Change

S = JobState
_TERMINAL = (S.SUCCEEDED, S.FAILED, S.CANCELLED)


def count_submitted(session: Session, _change: Change) -> None:
    metrics = metrics_of(session)
    if metrics is not None:
        after_commit(session, metrics.jobs_submitted.inc)


def count_change(session: Session, change: Change) -> None:
    """After the row changed (``lifecycle_times`` has set started_at / finished_at): the admission's queue
    wait, a restart and its reason, a terminal state and the run's duration."""
    metrics = metrics_of(session)
    if metrics is None:
        return
    job, to_state = change.row, change.to_state
    if change.from_state == S.QUEUED and to_state == S.STARTING and job.created_at is not None:
        waited = (change.at - job.created_at).total_seconds()
        after_commit(session, lambda: metrics.job_queue_wait.observe(max(waited, 0.0)))
    elif to_state == S.RESTARTING:
        reason = metrics.restart_reason(change.reason)
        after_commit(session, metrics.job_restarts.labels(reason).inc)
    elif to_state in _TERMINAL:
        state = to_state.value
        after_commit(session, metrics.jobs_finished.labels(state).inc)
        if job.started_at is not None:
            ran = (change.at - job.started_at).total_seconds()
            after_commit(session, lambda: metrics.job_run_duration.labels(state).observe(max(ran, 0.0)))
