"""Applying what a job's driver and workers report: state changes, metric points, checkpoints."""

from __future__ import annotations

import logging

from sqlalchemy.orm import Session

from orchestrator.db.models import Job, JobState
from orchestrator.repositories import jobs as jobs_repo
from orchestrator.states import IllegalTransition, set_job_state
from workers.spec import CheckpointEvent, EventBatch, MetricsEvent, StateEvent

log = logging.getLogger(__name__)

TARGET_STATE = {
    "running": JobState.RUNNING,
    "restarting": JobState.RESTARTING,
    "succeeded": JobState.SUCCEEDED,
    "failed": JobState.FAILED,
}
DEFAULT_REASON = {
    "running": "training_started",
    "restarting": "worker_died",
    "succeeded": "completed",
    "failed": "app_error",
}


def apply_events(session: Session, job: Job, batch: EventBatch) -> int:
    """Apply a batch to a locked job; returns how many events changed something.

    Every event is idempotent (a retried batch changes nothing), and a state the rules no longer allow
    (a late "running" after a cancel) is ignored rather than refused, so the reporter doesn't retry it.
    """
    applied = 0
    for event in batch.events:
        if isinstance(event, MetricsEvent):
            jobs_repo.record_metrics(session, job, batch.attempt, event.epoch, event.step, event.values)
            applied += 1
        elif isinstance(event, CheckpointEvent):
            # Only recorded here: retention deletes what it drops after the commit, storage first and
            # with no lock held (``services.retention``; see ``api/routers/internal.py``).
            jobs_repo.record_checkpoint(
                session, job, batch.attempt, event.epoch, event.step, event.path, event.size_bytes, event.metrics
            )
            applied += 1
        elif isinstance(event, StateEvent):
            applied += _apply_state(session, job, event)
    return applied


def _apply_state(session: Session, job: Job, event: StateEvent) -> bool:
    if event.result is not None:
        job.result = event.result
    try:
        return set_job_state(
            session, job, TARGET_STATE[event.state], event.reason or DEFAULT_REASON[event.state], event.message
        )
    except IllegalTransition as exc:
        log.info("ignoring reported state: %s", exc)
        return False
