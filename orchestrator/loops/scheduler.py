"""Admits queued jobs and sweeps, by priority then age, when the cluster has room for all of a job's
workers (a sweep's concurrent trials) at once."""

from __future__ import annotations

import logging

from sqlalchemy.orm import Session, sessionmaker

from orchestrator.admission import ClusterCapacity, Demand, free_of, never_fits, reserved_by, shortfall
from orchestrator.backend import BackendUnavailable, ClusterBackend
from orchestrator.db.models import JobState
from orchestrator.loops.serving import serving_reservation
from orchestrator.request_context import log_context
from orchestrator.services.launch import new_job_token
from orchestrator.services.runs import QueuedRun, RunKind, active_demands, queued_runs
from orchestrator.settings import Settings
from orchestrator.states.jobs import TERMINAL, note_waiting

log = logging.getLogger(__name__)


class Scheduler:
    def __init__(self, sessions: sessionmaker[Session], backend: ClusterBackend, settings: Settings):
        self.sessions = sessions
        self.backend = backend
        self.settings = settings

    def tick(self) -> None:
        with self.sessions() as session:
            queued = queued_runs(session)
            # What running jobs and sweeps hold, and Serve replicas (0 CPU by default).
            reserved = reserved_by([*active_demands(session), serving_reservation(session)])
        if not queued:
            return
        try:
            capacity = self.backend.capacity()
        except BackendUnavailable as exc:
            self._note_all(queued, "cluster_unavailable", f"waiting for the Ray cluster: {exc}")
            return
        free = free_of(capacity, reserved)
        # Best effort in priority order: a run that does not fit now waits with a reason, and smaller
        # ones behind it may still start on what is free.
        waits: list[tuple[QueuedRun, tuple[str, str]]] = []
        for run in queued:
            request = run.demand.total
            missing = shortfall(request, free)
            with log_context(**{f"{run.kind.name}_id": run.id}):  # log lines name the job or sweep
                if missing is None and self._admit(run.kind, run.id):
                    free = {r: free[r] - request[r] for r in free}
                elif missing is not None and never_fits(run.demand, capacity):
                    self._fail(run.kind, run.id, run.demand, capacity)
                elif missing is not None:
                    waiting = ("insufficient_resources", f"waiting for resources: {missing}")
                    if waiting != run.waiting:
                        waits.append((run, waiting))
        # Only the reasons that changed, in one transaction: a long queue that stays put (hundreds of
        # jobs waiting for a busy cluster) costs one read a tick, not a locked write per job.
        self._note_waiting(waits)

    def _admit(self, kind: RunKind, run_id: str) -> bool:
        with self.sessions.begin() as session:
            run = kind.lock(session, run_id)
            if run is None or run.state != JobState.QUEUED:
                return False  # cancelled (or admitted) since we looked
            token = new_job_token(run)
            # Admission starts the next attempt (the state engine bumps it: orchestrator.states.jobs).
            kind.set_state(session, run, JobState.STARTING, "admitted", f"attempt {run.attempt + 1} submitted to Ray")
            launch = kind.launch(session, run)
            if launch is None:
                return False  # its code package is gone: FAILED (code_missing)
        # Submitted after the commit: if this process dies here, the reconciler finds the STARTING run
        # with no Ray job and submits the same submission id, which Ray runs at most once.
        try:
            kind.submit(self.sessions, launch, token, self.backend, self.settings)
            log.info("%s %s: submitted %s", kind.name, run_id, launch.submission_id)
        except BackendUnavailable as exc:
            log.warning("%s %s: submit failed, the reconciler will retry: %s", kind.name, run_id, exc)
            return True
        with self.sessions() as session:
            run = session.get(kind.model, run_id)
            cancelled = run is not None and (run.state in TERMINAL or run.state == JobState.CANCELLING)
        if cancelled:
            self.backend.stop(launch.submission_id)  # cancelled while we were submitting
        return True

    def _fail(self, kind: RunKind, run_id: str, demand: Demand, capacity: ClusterCapacity) -> None:
        impossible = never_fits(demand, capacity)
        with self.sessions.begin() as session:
            run = kind.lock(session, run_id)
            if run is None or run.state != JobState.QUEUED or not impossible:
                return
            kind.set_state(session, run, JobState.FAILED, "insufficient_resources", f"can never run: {impossible}")

    def _note_waiting(self, waits: list[tuple[QueuedRun, tuple[str, str]]]) -> None:
        if not waits:
            return
        with self.sessions.begin() as session:
            for queued_run, (reason, message) in waits:
                run = queued_run.kind.lock(session, queued_run.id)
                if run is not None and run.state == JobState.QUEUED:  # not cancelled since we looked
                    note_waiting(run, reason, message)

    def _note_all(self, queued: list[QueuedRun], reason: str, message: str) -> None:
        self._note_waiting([(run, (reason, message)) for run in queued if run.waiting != (reason, message)])
