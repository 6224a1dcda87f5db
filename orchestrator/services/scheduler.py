"""Admits queued jobs, by priority then age, when the cluster has room for all their workers at once."""

from __future__ import annotations

import logging

from sqlalchemy.orm import Session, sessionmaker

from orchestrator.admission import ClusterCapacity, free_of, never_fits, request_of, reserved_by, shortfall
from orchestrator.backend import BackendUnavailable, ClusterBackend
from orchestrator.db.models import Job, JobState
from orchestrator.repositories import jobs as jobs_repo
from orchestrator.services.launch import Launch, new_job_token
from orchestrator.services.serving import serving_reservation
from orchestrator.settings import Settings
from orchestrator.states import TERMINAL, lock_job, note_waiting, set_job_state
from workers.spec import JobSpec

log = logging.getLogger(__name__)


class Scheduler:
    def __init__(self, sessions: sessionmaker[Session], backend: ClusterBackend, settings: Settings):
        self.sessions = sessions
        self.backend = backend
        self.settings = settings

    def tick(self) -> None:
        with self.sessions() as session:
            queued = [(job.id, JobSpec.model_validate(job.spec)) for job in jobs_repo.queued_jobs(session)]
            reserved = reserved_by(
                [*(request_of(JobSpec.model_validate(j.spec)) for j in jobs_repo.active_jobs(session)),
                 serving_reservation(session)]  # what Serve replicas hold (0 CPU by default)
            )
        if not queued:
            return
        try:
            capacity = self.backend.capacity()
        except BackendUnavailable as exc:
            self._note_all(queued, "cluster_unavailable", f"waiting for the Ray cluster: {exc}")
            return
        free = free_of(capacity, reserved)
        # Best effort in priority order: a job that does not fit now waits with a reason, and smaller
        # jobs behind it may still start on what is free.
        for job_id, spec in queued:
            request = request_of(spec)
            missing = shortfall(request, free)
            if missing is None and self._admit(job_id):
                free = {r: free[r] - request[r] for r in free}
            elif missing is not None:
                self._wait_or_fail(job_id, spec, capacity, missing)

    def _admit(self, job_id: str) -> bool:
        with self.sessions.begin() as session:
            job = lock_job(session, job_id)
            if job is None or job.state != JobState.QUEUED:
                return False  # cancelled (or admitted) since we looked
            job.attempt += 1
            token = new_job_token(job)
            set_job_state(session, job, JobState.STARTING, "admitted", f"attempt {job.attempt} submitted to Ray")
            launch = Launch.of(job)
        # Submitted after the commit: if this process dies here, the reconciler finds the STARTING job
        # with no Ray run and submits the same submission id, which Ray runs at most once.
        try:
            launch.submit(self.backend, token, self.settings)
            log.info("job %s: submitted %s", job_id, launch.submission_id)
        except BackendUnavailable as exc:
            log.warning("job %s: submit failed, the reconciler will retry: %s", job_id, exc)
            return True
        with self.sessions() as session:
            job = session.get(Job, job_id)
            cancelled = job is not None and (job.state in TERMINAL or job.state == JobState.CANCELLING)
        if cancelled:
            self.backend.stop(launch.submission_id)  # cancelled while we were submitting
        return True

    def _wait_or_fail(self, job_id: str, spec: JobSpec, capacity: ClusterCapacity, missing: str) -> None:
        impossible = never_fits(spec, capacity)
        with self.sessions.begin() as session:
            job = lock_job(session, job_id)
            if job is None or job.state != JobState.QUEUED:
                return
            if impossible:
                set_job_state(session, job, JobState.FAILED, "insufficient_resources", f"can never run: {impossible}")
            else:
                note_waiting(job, "insufficient_resources", f"waiting for resources: {missing}")

    def _note_all(self, queued: list[tuple[str, JobSpec]], reason: str, message: str) -> None:
        with self.sessions.begin() as session:
            for job_id, _ in queued:
                job = lock_job(session, job_id)
                if job is not None and job.state == JobState.QUEUED:
                    note_waiting(job, reason, message)

