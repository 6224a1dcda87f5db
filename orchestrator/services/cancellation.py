"""Cancelling a job: a queued job never starts; a started one is stopped in Ray, then ends CANCELLED."""

from __future__ import annotations

import logging

from sqlalchemy.orm import Session

from orchestrator.backend import BackendUnavailable, ClusterBackend
from orchestrator.db.models import Job, JobState
from orchestrator.states import TERMINAL, lock_job, set_job_state

log = logging.getLogger(__name__)


class AlreadyFinished(ValueError):
    pass


def cancel_job(session: Session, job_id: str, backend: ClusterBackend) -> Job:
    """Commits the transition, then asks Ray to stop; the reconciler finishes it (CANCELLING -> CANCELLED)."""
    job = lock_job(session, job_id)
    assert job is not None, "callers check the job exists and is theirs"
    if job.state in TERMINAL:
        raise AlreadyFinished(f"job {job.id} already ended {job.state}")
    if job.state == JobState.QUEUED:
        set_job_state(session, job, JobState.CANCELLED, "cancelled", "cancelled before it started")
        session.commit()
        return job
    set_job_state(session, job, JobState.CANCELLING, "cancel_requested", "stopping the Ray job")
    session.commit()
    try:
        backend.stop(job.submission_id)
    except BackendUnavailable as exc:
        log.warning("job %s: stop failed, the reconciler will retry: %s", job.id, exc)
    return job
