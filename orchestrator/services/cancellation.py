"""Cancelling a job or a sweep: a queued one never starts; a started one is stopped in Ray, then ends
CANCELLED (a sweep's trials with it)."""

from __future__ import annotations

import logging

from sqlalchemy.orm import Session

from orchestrator.backend import BackendUnavailable
from orchestrator.backend.registry import ClusterBackends
from orchestrator.db.models import Job, JobState
from orchestrator.errors import Conflict
from orchestrator.services.runs import JOBS, Run, RunKind
from orchestrator.states.jobs import TERMINAL

log = logging.getLogger(__name__)


class AlreadyFinished(Conflict):
    pass


def cancel_run(session: Session, kind: RunKind, run_id: str, backends: ClusterBackends) -> Run:
    """Commits the transition, then asks Ray to stop; the reconciler finishes it (CANCELLING -> CANCELLED)."""
    run = kind.lock(session, run_id)
    assert run is not None, "callers check the run exists and is theirs"
    if run.state in TERMINAL:
        raise AlreadyFinished(f"{kind.name} {run.id} already ended {run.state}")
    if run.state == JobState.QUEUED:
        kind.set_state(session, run, JobState.CANCELLED, "cancelled", "cancelled before it started")
        session.commit()
        return run
    kind.set_state(session, run, JobState.CANCELLING, "cancel_requested", "stopping the Ray job")
    session.commit()
    try:
        backends.of(run, session).stop(run.submission_id)  # on the cluster it runs on
    except BackendUnavailable as exc:
        log.warning("%s %s: stop failed, the reconciler will retry: %s", kind.name, run.id, exc)
    return run


def cancel_job(session: Session, job_id: str, backends: ClusterBackends) -> Job:
    return cancel_run(session, JOBS, job_id, backends)
