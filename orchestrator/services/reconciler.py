"""Brings the database in line with Ray: notices runs that ended, vanished or must be stopped.

Ray is asked first, without holding a lock; then the job row is locked and the decision is made
against its current state, so a concurrent cancel or event is never overwritten.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from sqlalchemy.orm import Session, sessionmaker

from orchestrator.auth import generate_secret, hash_secret
from orchestrator.backend import BackendUnavailable, ClusterBackend, RunInfo, RunStatus
from orchestrator.db.models import Job, JobState, utcnow
from orchestrator.repositories import jobs as jobs_repo
from orchestrator.services.launch import Launch
from orchestrator.settings import Settings
from orchestrator.states import lock_job, set_job_state

log = logging.getLogger(__name__)

# A STARTING job whose submission Ray doesn't know yet is normal for a moment (the scheduler commits,
# then submits). Past this grace the submit was lost and is made again, with the same submission id.
RESUBMIT_GRACE = timedelta(seconds=10)

S = JobState


class Reconciler:
    def __init__(self, sessions: sessionmaker[Session], backend: ClusterBackend, settings: Settings):
        self.sessions = sessions
        self.backend = backend
        self.settings = settings

    def tick(self) -> None:
        with self.sessions() as session:
            active = [(job.id, job.attempt, job.submission_id) for job in jobs_repo.active_jobs(session)]
        for job_id, attempt, submission_id in active:
            try:
                info = self.backend.info(submission_id)
            except BackendUnavailable as exc:
                log.warning("reconciler: Ray unreachable, will retry: %s", exc)
                return
            try:
                self._reconcile(job_id, attempt, info)
            except BackendUnavailable as exc:
                log.warning("reconciler: job %s: %s", job_id, exc)

    def _reconcile(self, job_id: str, attempt: int, info: RunInfo) -> None:
        resubmit: tuple[Launch, str] | None = None
        with self.sessions.begin() as session:
            job = lock_job(session, job_id)
            if job is None or job.attempt != attempt:
                return  # moved on since we asked Ray
            status = info.status
            if job.state == S.CANCELLING:
                if status.finished and status != RunStatus.SUCCEEDED:
                    set_job_state(session, job, S.CANCELLED, "cancelled", "stopped at the user's request")
                elif status == RunStatus.SUCCEEDED:
                    set_job_state(session, job, S.SUCCEEDED, "completed", "finished before the cancel took effect")
                else:
                    self.backend.stop(job.submission_id)  # again: the first stop may have raced the submit
            elif status == RunStatus.SUCCEEDED:
                set_job_state(session, job, S.SUCCEEDED, "completed", "the driver exited successfully")
            elif status == RunStatus.FAILED:
                set_job_state(session, job, S.FAILED, "driver_failed", _failure_message(info, self.backend, job))
            elif status == RunStatus.STOPPED:
                set_job_state(session, job, S.FAILED, "stopped_externally", "the Ray job was stopped outside the control plane")
            elif status == RunStatus.MISSING:
                if job.state != S.STARTING:
                    set_job_state(session, job, S.FAILED, "driver_lost", "Ray has no record of the job's driver any more")
                elif utcnow() - job.updated_at > RESUBMIT_GRACE:
                    token = generate_secret("jtk_")
                    job.token_hash = hash_secret(token)
                    resubmit = (Launch.of(job), token)
        if resubmit:
            launch, token = resubmit
            log.info("job %s: Ray has no run for %s; submitting it again", job_id, launch.submission_id)
            launch.submit(self.backend, token, self.settings)


def _failure_message(info: RunInfo, backend: ClusterBackend, job: Job) -> str:
    """Ray's message plus the end of the driver's output: the traceback is usually there."""
    try:
        logs = backend.logs(job.submission_id) or ""
    except BackendUnavailable:
        logs = ""
    tail = logs[-4000:]
    return f"{info.message}\n--- end of driver output ---\n{tail}" if tail else info.message

