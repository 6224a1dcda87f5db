"""Hang detection for a sweep's trials (``base.failure.hang_timeout_s``; docs/jobs.md "Hangs").

A job's hang ends its attempt (``services.hangs``); a trial shares its sweep's Ray job with the other trials, so
its hang is ended inside it. The reconciler calls ``watch`` on every running sweep it looks at; for each RUNNING
trial whose progress (the arrival of its reports: its epochs, a function's each report) has not advanced for its hang timeout (as a job's: its base with the
trial's config, "auto" from its own epochs):

1. suspected: every rank of the trial is asked for its Python stack (``ControlSignal.trial_stacks_wanted``; each
   answers with a ``StacksEvent`` naming its trial and its worker process, printed in the sweep's log as well);
2. every rank answered, or ``hang_stacks_wait_s`` passed: the verdict (a ``hung`` row on the trial, the ranks'
   places as a job's), and the answering workers are told to end their processes (``ControlSignal.end_workers``).
   Ray Train sees its workers die and restarts them from the trial's latest checkpoint, within
   ``retries.max_worker_restarts``; past that the trial fails, with reason ``hung`` (``failed_reason``);
3. progress arrived meanwhile: not hung, the suspicion is cleared (a ``progress_resumed`` row).

The clock is the control plane's own, as for a job: the arrival of the trial's epochs.
"""

from __future__ import annotations

import logging
from datetime import datetime

from sqlalchemy.orm import Session

from orchestrator.db.models import JobState, Sweep, Trial, TrialState, utcnow
from orchestrator.repositories import sweeps as sweeps_repo
from orchestrator.services.hangs import keep_answer, ranks_verdict, timeout_of
from orchestrator.settings import Settings
from orchestrator.states.jobs import HUNG
from orchestrator.states.sweeps import clear_trial_hang_suspicion, record_trial_hang, request_trial_stacks
from orchestrator_contract.jobs import JobSpec
from orchestrator_contract.sweeps import SweepSpec, trial_spec

log = logging.getLogger(__name__)


def watch(session: Session, sweep: Sweep, settings: Settings, watching_since: datetime, now: datetime | None = None):
    """In the caller's transaction, ``sweep`` locked: suspect, clear or judge each of its RUNNING trials (see the
    module). A sweep not RUNNING, or being stopped, is left alone: its trials are paused, not hung."""
    if sweep.state != JobState.RUNNING or sweep.preempt_requested_at is not None:
        return
    running = sweeps_repo.running_trials(session, sweep.id)
    if not running:
        return
    now = now or utcnow()
    spec = SweepSpec.model_validate(sweep.spec)
    # Trials run only while their sweep does: no trial is judged on a silence from before its sweep's (or this
    # control plane's) latest start.
    since = max(sweeps_repo.last_transition(session, sweep.id).created_at, watching_since)
    progress = sweeps_repo.trial_progress(session, [trial.id for trial in running])
    for trial in running:
        arrivals = sorted({*progress[trial.id], *([trial.progress_at] if trial.progress_at else [])})
        _watch_trial(session, trial, trial_spec(spec.base, trial.config), arrivals, since, settings, now)


def _watch_trial(
    session: Session,
    trial: Trial,
    spec: JobSpec,
    progress: list[datetime],
    since: datetime,
    settings: Settings,
    now: datetime,
) -> None:
    started = max(trial.started_at or since, since)
    last = max([started, *progress, *([trial.hung_at] if trial.hung_at else [])])
    if trial.stacks_requested_at is not None:
        if last > trial.stacks_requested_at:
            clear_trial_hang_suspicion(session, trial, "progress again after its stacks were asked for: not hung")
            return
        answered = trial.stacks or {}
        waited = (now - trial.stacks_requested_at).total_seconds()
        if len(answered) < spec.scaling.num_workers and waited < settings.hang_stacks_wait_s:
            return
        _judge(session, trial, spec, answered, (now - last).total_seconds())
        return
    limit = timeout_of(spec.model_dump(mode="json"), progress, started, settings.hang_timeout_floor_s)
    idle = (now - last).total_seconds()
    if limit is None or idle < limit:
        return
    request_trial_stacks(
        session,
        trial,
        f"no progress for {idle:.0f} s (its hang timeout is {limit:g} s): asked every rank for its Python stack",
    )
    log.warning("trial %s: no progress for %.0f s (hang timeout %g s): asking for its stacks", trial.id, idle, limit)


def _judge(session: Session, trial: Trial, spec: JobSpec, answered: dict, idle_s: float) -> None:
    last_reported = f"epoch {trial.iterations}" if trial.iterations else ""
    message = ranks_verdict(spec.scaling.num_workers, answered, idle_s, last_reported)
    ended = bool(workers_of(trial))
    if ended:
        message += (
            "\nits workers are ended: Ray Train restarts them from the trial's latest checkpoint (within "
            f"retries.max_worker_restarts, {spec.retries.max_worker_restarts})"
        )
    else:
        message += "\nno rank answered (its workers are gone, paused, or hold the GIL): no worker to end"
    record_trial_hang(session, trial, message, ended)
    log.warning("trial %s: %s", trial.id, message.split("\n", 1)[0])


def workers_of(trial: Trial) -> list[str]:
    """The worker processes that answered the trial's last request for stacks."""
    return [answer["worker"] for answer in (trial.stacks or {}).values() if answer.get("worker")]


def record_stacks(session: Session, sweep: Sweep, answer: dict) -> bool:
    """Keep a trial rank's answer (a ``StacksEvent`` as a dict, with its ``trial``) if it answers that trial's
    open request; True if kept."""
    trial = sweeps_repo.find_trial(session, sweep.id, answer.get("trial") or "")
    if trial is None or trial.state != TrialState.RUNNING:
        return False
    ranks = trial_spec(SweepSpec.model_validate(sweep.spec).base, trial.config).scaling.num_workers
    return keep_answer(trial, answer, ranks)


def signal(trials: list[Trial]) -> tuple[dict[str, str], list[str]]:
    """The sweep's control signal's ``(trial_stacks_wanted, end_workers)`` for its trials."""
    running = [trial for trial in trials if trial.state == TrialState.RUNNING]
    wanted = {t.tune_id: t.stacks_requested_at.isoformat() for t in running if t.stacks_requested_at is not None}
    ending = [
        worker for t in running if t.hung_at is not None and t.stacks_requested_at is None for worker in workers_of(t)
    ]
    return wanted, ending


def failed_reason(session: Session, trial: Trial, reason: str, message: str) -> tuple[str, str]:
    """A failing trial's reason and message: ``hung`` when its workers were ended for a hang (``hangs``) and it
    made no progress since (its restarts' budget ran out hung); else as the driver classified it."""
    if not trial.hangs or trial.hung_at is None:
        return reason, message
    if trial.progress_at is not None and trial.progress_at > trial.hung_at:
        return reason, message
    verdict = trial.message if trial.reason == HUNG else "hung"
    return HUNG, f"{verdict}\nhung {trial.hangs} time(s); what ended it:\n{message}"[-20_000:]
