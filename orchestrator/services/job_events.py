"""Applying what a job's driver and workers report: state changes, metric points, checkpoints."""

from __future__ import annotations

import logging

from sqlalchemy.orm import Session

from orchestrator.db.models import Job, JobState, Sweep
from orchestrator.errors import Refused
from orchestrator.repositories import jobs as jobs_repo
from orchestrator.services import hangs, reported_ends, stragglers
from orchestrator.states import startup
from orchestrator.states.core import IllegalTransition
from orchestrator.states.jobs import set_job_state
from orchestrator.storage import CheckpointStorage
from orchestrator_contract.jobs import (
    CheckpointEvent,
    EventBatch,
    MetricsEvent,
    StacksEvent,
    StartupEvent,
    StateEvent,
)

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


class RefusedEvent(Refused):
    """400: a batch holds an event no honest driver sends; nothing of the batch is applied."""


def check_checkpoint_paths(job: Job, batch: EventBatch, storage: CheckpointStorage) -> None:
    """A job's driver may record only checkpoint folders in its own run folder: else its token could
    register (and a member of its project then deploy) another project's checkpoint."""
    for event in batch.events:
        paths = [event.path] if isinstance(event, CheckpointEvent) else []
        if isinstance(event, StateEvent) and isinstance(event.result, dict) and event.result.get("checkpoint_path"):
            paths.append(str(event.result["checkpoint_path"]))
        for path in paths:
            if not storage.owns_checkpoint(job.id, path):
                raise RefusedEvent(
                    f"checkpoint {path} is not a checkpoint_* folder of job {job.id}'s run folder "
                    f"{storage.run_dir(job.id)}"
                )


def apply_events(
    session: Session,
    job: Job,
    batch: EventBatch,
    storage: CheckpointStorage,
    straggler_windows: int = stragglers.DEFAULT_WINDOWS,
) -> int:
    """Apply a batch to a locked job; returns how many events changed something. RefusedEvent, before
    anything is applied, for a checkpoint outside the job's own run folder.

    Every event is idempotent (a retried batch changes nothing), and a state the rules no longer allow
    (a late "running" after a cancel) is ignored rather than refused, so the reporter doesn't retry it. A
    report of the job's end (succeeded, failed) is held until Ray confirms it (``services.reported_ends``).
    """
    check_checkpoint_paths(job, batch, storage)
    applied = 0
    for event in batch.events:
        if isinstance(event, MetricsEvent):
            jobs_repo.record_metrics(
                session, job, batch.attempt, event.epoch, event.step, event.values, event.checkpoint_blocked_s
            )
            if event.rank_step_s:  # each rank's own time per step in the window (services.stragglers)
                stragglers.observe(session, job, event.step, event.rank_step_s, straggler_windows)
            applied += 1
        elif isinstance(event, CheckpointEvent):
            # Only recorded here: retention deletes what it drops after the commit, storage first and
            # with no lock held (``orchestrator.loops.retention``; see ``api/routers/internal.py``).
            jobs_repo.record_checkpoint(
                session, job, batch.attempt, event.epoch, event.step, event.path, event.size_bytes, event.metrics
            )
            applied += 1
        elif isinstance(event, StateEvent):
            applied += _apply_state(session, job, event)
        elif isinstance(event, StacksEvent):  # a rank's answer to a hang suspicion (services.hangs)
            applied += hangs.record_stacks(job, event.model_dump())
        elif isinstance(event, StartupEvent):  # a stage of the attempt's start (states.startup)
            applied += startup.mark(job, event.stage)
    return applied


def is_preemption_stop(kind: str, run: Job | Sweep, event: StateEvent) -> bool:
    """A job or sweep being preempted (orchestrator.services.preemption): a failure its driver reports while it
    is stopped is the stop itself, to be ignored; the reconciler moves the run back to QUEUED."""
    if run.preempt_requested_at is None or event.state not in ("failed", "restarting"):
        return False
    log.info("%s %s is being preempted: ignoring its reported %s (%s)", kind, run.id, event.state, event.reason)
    return True


def _apply_state(session: Session, job: Job, event: StateEvent) -> bool:
    if event.state == "running" and event.rank_nodes:  # where each rank runs (services.bad_nodes)
        job.rank_nodes = {"attempt": job.attempt, "nodes": event.rank_nodes}
    if is_preemption_stop("job", job, event):
        return False
    if reported_ends.is_end(event):  # applied when Ray confirms the Ray job ended (docs/security.md, finding 2)
        return reported_ends.hold("job", job, event, event.reason or DEFAULT_REASON[event.state])
    try:
        changed = set_job_state(
            session, job, TARGET_STATE[event.state], event.reason or DEFAULT_REASON[event.state], event.message
        )
    except IllegalTransition as exc:
        log.info("ignoring reported state: %s", exc)
        return False
    return changed
