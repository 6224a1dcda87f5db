"""Brings the database in line with Ray: notices runs that ended, vanished or must be stopped.

Ray is asked first, without holding a lock; then the job row is locked and the decision is made
against its current state, so a concurrent cancel or event is never overwritten.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from sqlalchemy.orm import Session, sessionmaker

from orchestrator.backend import BackendUnavailable, ClusterBackend, RunInfo, RunStatus
from orchestrator.db.models import Job, JobState, utcnow
from orchestrator.repositories import jobs as jobs_repo
from orchestrator.services.launch import Launch, new_job_token
from orchestrator.settings import Settings
from orchestrator.states import lock_job, set_job_state
from workers.spec import JobSpec

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
                if info.status == RunStatus.FAILED:  # read the driver's output now, not under the lock
                    info = RunInfo(info.status, _failure_message(info, self.backend, submission_id))
                self._reconcile(job_id, attempt, info)
            except BackendUnavailable as exc:
                log.warning("reconciler: job %s: %s", job_id, exc)

    def _reconcile(self, job_id: str, attempt: int, info: RunInfo) -> None:
        # Sent to Ray after the commit: a Ray call must not hold the row (on SQLite, the database) locked.
        resubmit: tuple[Launch, str] | None = None
        stop_again: str | None = None
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
                    stop_again = job.submission_id  # the first stop may have raced the submit
            elif status == RunStatus.SUCCEEDED:
                set_job_state(session, job, S.SUCCEEDED, "completed", "the driver exited successfully")
            elif status == RunStatus.FAILED:
                resubmit = _next_attempt(session, job, "driver_failed", info.message)
            elif status == RunStatus.STOPPED:
                set_job_state(session, job, S.FAILED, "stopped_externally", "the Ray job was stopped outside the control plane")
            elif status == RunStatus.MISSING:
                if job.state != S.STARTING:
                    resubmit = _next_attempt(session, job, "driver_lost", "Ray has no record of the job's driver any more")
                elif utcnow() - job.updated_at > RESUBMIT_GRACE:
                    resubmit = (Launch.of(job), new_job_token(job))  # the same attempt, the same submission id
        if stop_again:
            self.backend.stop(stop_again)
        if resubmit:
            launch, token = resubmit
            log.info("job %s: submitting %s", job_id, launch.submission_id)
            launch.submit(self.backend, token, self.settings)


def _next_attempt(session: Session, job: Job, reason: str, message: str) -> tuple[Launch, str] | None:
    """The driver died without reporting an outcome (a failure of the user's code it reports itself, as
    app_error): start attempt + 1, which resumes from the run's latest checkpoint, while attempts last."""
    max_attempts = JobSpec.model_validate(job.spec).retries.max_attempts
    if job.attempt >= max_attempts:
        set_job_state(session, job, S.FAILED, reason, f"{message}\n(attempt {job.attempt} of {max_attempts}: none left)")
        return None
    next_attempt = f"starting attempt {job.attempt + 1} of {max_attempts} from the latest checkpoint"
    set_job_state(session, job, S.RESTARTING, reason, f"{message}\n({next_attempt})", again=True)
    job.attempt += 1
    return Launch.of(job), new_job_token(job)


def _failure_message(info: RunInfo, backend: ClusterBackend, submission_id: str) -> str:
    """Ray's message plus the end of the driver's output: the traceback is usually there."""
    try:
        logs = backend.logs(submission_id) or ""
    except BackendUnavailable:
        logs = ""
    tail = logs[-4000:]
    return f"{info.message}\n--- end of driver output ---\n{tail}" if tail else info.message

