"""Brings the database in line with Ray: notices runs (jobs' and sweeps' drivers) that ended, vanished or
must be stopped.

Ray is asked first, without holding a lock; then the job row is locked and the decision is made
against its current state, so a concurrent cancel or event is never overwritten.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import timedelta

from sqlalchemy.orm import Session, sessionmaker

from orchestrator.backend import BackendUnavailable, ClusterBackend, RunInfo, RunStatus
from orchestrator.backend.registry import ClusterBackends, backends_of
from orchestrator.db.models import JobState, utcnow
from orchestrator.request_context import log_context
from orchestrator.services import bad_nodes, deadlines, hangs, reported_ends, trial_hangs
from orchestrator.services.launch import Launch, new_driver_claim
from orchestrator.services.preemption import PREEMPTIBLE_STATES, attempts_used, settle, stopped
from orchestrator.services.runs import KINDS, Run, RunKind
from orchestrator.settings import Settings
from orchestrator.states.jobs import STRAGGLER_BY, STRAGGLER_RESTARTED
from orchestrator_contract.jobs import DriverExit

log = logging.getLogger(__name__)

# A STARTING job whose submission Ray doesn't know yet is normal for a moment (the scheduler commits,
# then submits). Past this grace the submit was lost and is made again, with the same submission id.
RESUBMIT_GRACE = timedelta(seconds=10)

S = JobState

# Driver exits that carry a final outcome: (reason, message) when its report of it never arrived.
CONCLUSIVE_EXITS = {
    DriverExit.TRAINING_FAILED: ("training_failed", "the driver reported that training failed for good"),
    DriverExit.MISCONFIGURED: ("misconfigured", "the driver's environment lacks ORCHESTRATOR_URL or its claim code"),
}


class Reconciler:
    def __init__(self, sessions: sessionmaker[Session], backends: ClusterBackends | ClusterBackend, settings: Settings):
        self.sessions = sessions
        self.backends = backends_of(backends, sessions, settings.cluster_name)
        self.settings = settings
        # Hang detection counts silence from here at the earliest: while no control plane ran, reports waited.
        self.watching_since = utcnow()

    def tick(self) -> None:
        with self.sessions() as session:
            self.backends.refresh(session)
            active = [
                (
                    kind,
                    run.id,
                    run.attempt,
                    run.submission_id,
                    kind.name == "job" and bad_nodes.needs_verifying(run),
                    run.cluster,
                )
                for kind in KINDS
                for run in kind.active(session)
            ]
        unreachable: set[str | None] = set()  # a cluster that can't be reached: its runs wait, the others go on
        for kind, run_id, attempt, submission_id, verify_nodes, cluster in active:
            if cluster in unreachable:
                continue
            with log_context(**{f"{kind.name}_id": run_id}):  # log lines name the job or sweep
                try:
                    backend = self.backends.get(cluster)
                    info = backend.info(submission_id)
                except BackendUnavailable as exc:
                    log.warning("reconciler: cluster %s unreachable, will retry: %s", cluster or "default", exc)
                    unreachable.add(cluster)
                    continue
                try:
                    if info.status == RunStatus.FAILED:  # read the driver's output now, not under the lock
                        info = replace(info, message=_failure_message(info, backend, submission_id))
                    # Where Ray says the job's workers run, to check rank 0's report against (services.bad_nodes).
                    worker_nodes = backend.worker_nodes(submission_id) if verify_nodes else None
                    self._reconcile(kind, run_id, attempt, info, worker_nodes, backend)
                except BackendUnavailable as exc:
                    log.warning("reconciler: %s %s: %s", kind.name, run_id, exc)

    def _reconcile(
        self,
        kind: RunKind,
        run_id: str,
        attempt: int,
        info: RunInfo,
        worker_nodes: set[str] | None = None,
        backend: ClusterBackend | None = None,
    ) -> None:
        """Decide under the row's lock; ``backend`` is the run's cluster's (None: the default one)."""
        backend = backend or self.backends.default
        # Sent to Ray after the commit: a Ray call must not hold the row (on SQLite, the database) locked.
        resubmit: tuple[Launch, str] | None = None
        stop_again: str | None = None
        forget: str | None = None
        with self.sessions.begin() as session:
            run = kind.lock(session, run_id)
            if run is None or run.attempt != attempt:
                return  # moved on since we asked Ray
            if worker_nodes:  # none yet (workers still starting): asked again at the next tick
                bad_nodes.verify_rank_nodes(run, worker_nodes)
            status = info.status
            # A run's own report of its end waits for Ray (services.reported_ends): applied when Ray agrees;
            # forgotten, and said in what the run becomes, when Ray says it ended otherwise.
            if reported_ends.apply_if_confirmed(session, kind, run, info):
                return
            unconfirmed = reported_ends.drop_unconfirmed(kind.name, run, info)
            if unconfirmed:
                info = replace(info, message=f"{info.message}\n({unconfirmed})")
            if not status.finished and deadlines.enforce(session, kind, run):
                return  # past its deadline, asked to checkpoint and stop: settled below on a later pass
            watched = kind.name == "job" and not status.finished
            hung = hangs.watch(session, run, self.settings, self.watching_since) if watched else None
            if kind.name == "sweep" and not status.finished:  # its trials' hangs end inside it (trial_hangs)
                trial_hangs.watch(session, run, self.settings, self.watching_since)
            if hung is not None:
                # Its Ray job is stopped (the hung ranks with it) and the next attempt resumes from the latest
                # checkpoint, as after a lost driver: the same budget (retries.max_attempts), then FAILED hung.
                stop_again = run.submission_id
                for rank in hung.blamed:  # before the next attempt: the ranks' nodes are this attempt's
                    bad_nodes.record_fault(session, run, rank, bad_nodes.HUNG, hung.message.split("\n", 1)[0])
                resubmit = _next_attempt(session, kind, run, hung.reason, hung.message)
            elif (
                run.preempt_by == STRAGGLER_BY and status != RunStatus.SUCCEEDED and stopped(session, kind, run, status)
            ):
                # Checkpointed and stopped for a straggler (failure.on_straggler: restart): the next attempt, counted,
                # placed without the straggler's node (its driver's assignment, services.bad_nodes).
                resubmit = _next_attempt(
                    session, kind, run, STRAGGLER_RESTARTED, "stopped for a straggler (failure.on_straggler: restart)"
                )
            elif run.preempt_requested_at is not None and run.state in PREEMPTIBLE_STATES:
                # Preempted (orchestrator.services.preemption), or stopping at its deadline: its Ray job ending,
                # stopped or lost is the stop itself, never a failure; back to QUEUED (a deadline: FAILED) once gone.
                grace_s = self.settings.preemption_grace_s
                if settle(session, run, status, grace_s, exit_code=info.exit_code, kind=kind):
                    stop_again = run.submission_id
            elif run.state == S.CANCELLING:
                if status.finished and status != RunStatus.SUCCEEDED:
                    kind.set_state(
                        session, run, S.CANCELLED, "cancelled", _with(unconfirmed, "stopped at the user's request")
                    )
                elif status == RunStatus.SUCCEEDED:
                    kind.set_state(
                        session,
                        run,
                        S.SUCCEEDED,
                        "completed",
                        _with(unconfirmed, "finished before the cancel took effect"),
                    )
                else:
                    stop_again = run.submission_id  # the first stop may have raced the submit
            elif status == RunStatus.SUCCEEDED:
                kind.set_state(
                    session, run, S.SUCCEEDED, "completed", _with(unconfirmed, "the driver exited successfully")
                )
            elif status == RunStatus.FAILED and info.exit_code in CONCLUSIVE_EXITS:
                # The driver decided (its own report, with the cause, was lost): another attempt won't help.
                reason, what = CONCLUSIVE_EXITS[info.exit_code]
                kind.set_state(session, run, S.FAILED, reason, f"{what}\n{info.message}")
            elif status == RunStatus.FAILED and info.unschedulable:
                # Ray could not place the driver (its node gone, draining or not yet back: a head restarting), so
                # it never ran: no attempt of the run's to count. Ray's record goes, and the MISSING branch below
                # submits the same attempt again after RESUBMIT_GRACE; ORCHESTRATOR_START_TIMEOUT_S bounds it.
                log.warning(
                    "%s %s: Ray could not place its driver, submitting it again: %s",
                    kind.name,
                    run_id,
                    info.message.split("\n", 1)[0],
                )
                forget = run.submission_id
            elif status == RunStatus.FAILED:
                resubmit = _next_attempt(session, kind, run, "driver_failed", info.message)
            elif status == RunStatus.STOPPED:
                kind.set_state(
                    session,
                    run,
                    S.FAILED,
                    "stopped_externally",
                    _with(unconfirmed, "the Ray job was stopped outside the control plane"),
                )
            elif status == RunStatus.MISSING and not _awaiting_first_report(session, kind, run):
                lost = _with(unconfirmed, "Ray has no record of the driver any more")
                resubmit = _next_attempt(session, kind, run, "driver_lost", lost)
            elif (
                run.state in (S.STARTING, S.RESTARTING)
                and reported_ends.held(run) is None  # its driver started: it reported its end
                and self._start_timed_out(session, kind, run)
            ):
                stop_again = run.submission_id
                resubmit = _next_attempt(
                    session,
                    kind,
                    run,
                    "start_timeout",
                    f"{run.state} for longer than ORCHESTRATOR_START_TIMEOUT_S ({self.settings.start_timeout_s:g} s); "
                    f"Ray says the run is {status}: {info.message}",
                )
            elif status == RunStatus.MISSING and utcnow() - run.updated_at > RESUBMIT_GRACE:
                resubmit = _launch(session, kind, run)  # the same attempt, the same submission id
        if stop_again:
            backend.stop(stop_again)
        if forget:
            backend.forget(forget)
        if resubmit:  # on the cluster it was placed on: its checkpoints are there
            launch, claim_code = resubmit
            log.info("%s %s: submitting %s", kind.name, run_id, launch.submission_id)
            kind.submit(self.sessions, launch, claim_code, backend, self.settings)

    def _start_timed_out(self, session: Session, kind: RunKind, run: Run) -> bool:
        waited = utcnow() - kind.last_transition(session, run.id).created_at
        return waited > timedelta(seconds=self.settings.start_timeout_s)


def _with(unconfirmed: str, message: str) -> str:
    """``message``, and on a line of its own why the run's own report of its end was not applied."""
    return f"{message}\n({unconfirmed})" if unconfirmed else message


def _next_attempt(session: Session, kind: RunKind, run: Run, reason: str, message: str) -> tuple[Launch, str] | None:
    """The driver was lost, or never got going, without an outcome (a failure it can judge, it reports with
    its cause): start attempt + 1, which resumes from the latest checkpoint (a sweep: from Tune's
    experiment state), while attempts last."""
    max_attempts = kind.max_attempts(run)
    used = attempts_used(run)  # attempts that followed a preemption are not counted
    if used >= max_attempts:
        kind.set_state(session, run, S.FAILED, reason, f"{message}\n(attempt {used} of {max_attempts}: none left)")
        return None
    next_attempt = f"starting attempt {used + 1} of {max_attempts} from the latest checkpoint"
    # A new driver: the state engine records the move under the lost attempt, then bumps it.
    kind.set_state(session, run, S.RESTARTING, reason, f"{message}\n({next_attempt})", new_attempt=True)
    return _launch(session, kind, run)


def _launch(session: Session, kind: RunKind, run: Run) -> tuple[Launch, str] | None:
    """The run's current attempt and a new claim code for its driver; None when the run failed instead (its code
    package is gone)."""
    launch = kind.launch(session, run)
    return None if launch is None else (launch, new_driver_claim(run))


def _awaiting_first_report(session: Session, kind: RunKind, run: Run) -> bool:
    """Submitted (or about to be) and not heard from since: STARTING, or RESTARTING into a new attempt
    (that transition is recorded under the previous attempt's number)."""
    return run.state == S.STARTING or (
        run.state == S.RESTARTING and kind.last_transition(session, run.id).attempt < run.attempt
    )


def _failure_message(info: RunInfo, backend: ClusterBackend, submission_id: str) -> str:
    """Ray's message plus the end of the driver's output: the traceback is usually there."""
    try:
        logs = backend.logs(submission_id) or ""
    except BackendUnavailable:
        logs = ""
    tail = logs[-4000:]
    return f"{info.message}\n--- end of driver output ---\n{tail}" if tail else info.message
