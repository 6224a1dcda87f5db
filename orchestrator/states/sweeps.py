"""Sweep and trial rules.

A sweep follows a job's lifecycle, rules and companion fields (``orchestrator.states.jobs``): QUEUED ->
STARTING -> RUNNING <-> RESTARTING -> SUCCEEDED | FAILED | CANCELLED, with CANCELLING between a cancel and
the end, and back to QUEUED when it is preempted (reason ``preempted``, as a job). When a sweep ends, every
trial still open ends with it (CANCELLED), in the same transaction; a preempted sweep's open trials stay
open: its next attempt resumes them.

Trials have their own states, as Ray Tune reports them:

    PENDING -> RUNNING | FAILED | CANCELLED
    RUNNING -> SUCCEEDED | STOPPED | FAILED | CANCELLED     STOPPED: stopped early by the scheduler
    SUCCEEDED, STOPPED, FAILED, CANCELLED are final

A trial's history rows carry its sweep's attempt: the sweep driver under which the news arrived.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestrator.db.models import JobState, Sweep, SweepEvent, Trial, TrialEvent, TrialState
from orchestrator.states.core import (
    Change,
    Lifecycle,
    Rule,
    allowed,
    lock_row,
    record_creation,
    record_request,
    transition,
)
from orchestrator.states.jobs import (
    HANG_SUSPECTED,
    HUNG,
    JOB_RULES,
    PROGRESS_RESUMED,
    TERMINAL,
    attempt_after,
    attempt_before,
    lifecycle_times,
    preempted_record,
    preemption_after,
    queued_since,
    requeue_before,
)
from orchestrator.states.startup import startup_after
from orchestrator.states.sweep_metrics import count_change, count_submitted
from orchestrator.states.usage_ledger import trial_usage

T = TrialState
TRIAL_TERMINAL: frozenset[TrialState] = frozenset({T.SUCCEEDED, T.STOPPED, T.FAILED, T.CANCELLED})
TRIAL_RULES: tuple[Rule, ...] = (
    Rule(frozenset({T.PENDING}), frozenset({T.RUNNING, T.FAILED, T.CANCELLED})),
    Rule(frozenset({T.RUNNING}), frozenset({T.SUCCEEDED, T.STOPPED, T.FAILED, T.CANCELLED})),
)


def is_trial_allowed(from_state: TrialState, to_state: TrialState) -> bool:
    return allowed(TRIAL_RULES, from_state, to_state)


# --- trials ----------------------------------------------------------------------------------------------


def _trial_history(session: Session, change: Change) -> TrialEvent:
    trial = change.row
    sweep = session.get(Sweep, trial.sweep_id)  # locked by the caller: already in the session
    return TrialEvent(
        trial_id=trial.id,
        from_state=change.from_state,
        to_state=change.to_state,
        reason=change.reason,
        message=change.message,
        attempt=sweep.attempt if sweep is not None else 0,
    )


def _trial_times(_session: Session, change: Change) -> None:
    trial = change.row
    if change.to_state == T.RUNNING and trial.started_at is None:
        trial.started_at = change.at
    if change.to_state in TRIAL_TERMINAL:
        trial.finished_at = change.at


TRIAL_LIFECYCLE = Lifecycle(
    kind="trial",
    rules=TRIAL_RULES,
    initial=T.PENDING,
    terminal=TRIAL_TERMINAL,
    history=_trial_history,
    after=(_trial_times, trial_usage),
)


def set_trial_state(session: Session, trial: Trial, to_state: TrialState, reason: str, message: str = "") -> bool:
    """Move a trial (its sweep's row locked by the caller) to ``to_state`` and record why. Never commits."""
    return transition(session, TRIAL_LIFECYCLE, trial, to_state, reason, message)


def record_trial_created(session: Session, trial: Trial) -> None:
    """The history row of a trial the search just created (PENDING). Never commits."""
    record_creation(session, TRIAL_LIFECYCLE, trial, "created")


def request_trial_stacks(session: Session, trial: Trial, message: str) -> None:
    """Ask every rank of ``trial`` (RUNNING; its sweep locked) for its Python stack, as a job's
    (``states.jobs.request_stacks``): ``stacks_requested_at`` set, the answers emptied, a ``hang_suspected`` row."""

    def ask(_session: Session, change: Change) -> None:
        trial.stacks_requested_at = change.at
        trial.stacks = {}

    record_request(session, TRIAL_LIFECYCLE, trial, HANG_SUSPECTED, message, ask)


def clear_trial_hang_suspicion(session: Session, trial: Trial, message: str) -> None:
    """``trial`` made progress after its stacks were asked for: not hung (a ``progress_resumed`` row)."""

    def clear(_session: Session, _change: Change) -> None:
        trial.stacks_requested_at = None
        trial.stacks = None  # its answering workers go on: none of them may be ended

    record_request(session, TRIAL_LIFECYCLE, trial, PROGRESS_RESUMED, message, clear)


def record_trial_hang(session: Session, trial: Trial, message: str, ended_workers: bool) -> None:
    """``trial`` is hung (a ``hung`` row, its verdict): the request is closed, ``hung_at`` restarts its hang clock,
    and ``hangs`` counts the verdicts that ended its workers (``ControlSignal.end_workers``)."""

    def judge(_session: Session, change: Change) -> None:
        trial.stacks_requested_at = None
        trial.hung_at = change.at
        trial.hangs = (trial.hangs or 0) + (1 if ended_workers else 0)

    record_request(session, TRIAL_LIFECYCLE, trial, HUNG, message, judge)


# --- sweeps ----------------------------------------------------------------------------------------------


def _sweep_history(_session: Session, change: Change) -> SweepEvent:
    sweep = change.row
    return SweepEvent(
        sweep_id=sweep.id,
        from_state=change.from_state,
        to_state=change.to_state,
        reason=change.reason,
        message=change.message,
        attempt=sweep.attempt,
    )


def _open_trials_end(session: Session, change: Change) -> None:
    """A sweep that ends takes its open trials with it."""
    if change.to_state not in TERMINAL:
        return
    sweep = change.row
    open_trials = session.scalars(select(Trial).where(Trial.sweep_id == sweep.id, Trial.state.not_in(TRIAL_TERMINAL)))
    for trial in open_trials:
        set_trial_state(
            session, trial, T.CANCELLED, "sweep_ended", f"the sweep ended {change.to_state} ({change.reason})"
        )


SWEEP_LIFECYCLE = Lifecycle(
    kind="sweep",
    rules=JOB_RULES,  # a job's, preemption's requeue included
    initial=JobState.QUEUED,
    terminal=TERMINAL,
    history=_sweep_history,
    before=(attempt_before, requeue_before),
    after=(
        attempt_after,
        startup_after,
        lifecycle_times,
        queued_since,
        preempted_record,
        preemption_after,
        _open_trials_end,
        count_change,
    ),
    on_create=(queued_since, count_submitted),
    attempts=True,
)


def lock_sweep(session: Session, sweep_id: str) -> Sweep | None:
    return lock_row(session, Sweep, sweep_id)


def set_sweep_state(
    session: Session,
    sweep: Sweep,
    to_state: JobState,
    reason: str,
    message: str = "",
    again: bool = False,
    new_attempt: bool = False,
) -> bool:
    """Move a locked sweep to ``to_state`` and record why (see ``orchestrator.states.jobs.set_job_state``).
    A sweep that ends takes its open trials with it. Never commits."""
    return transition(session, SWEEP_LIFECYCLE, sweep, to_state, reason, message, again=again, new_attempt=new_attempt)


def record_sweep_created(session: Session, sweep: Sweep) -> None:
    """The history row of a sweep just submitted (QUEUED). Never commits."""
    record_creation(session, SWEEP_LIFECYCLE, sweep, "submitted")


def record_trial_straggler(session: Session, trial: Trial, entry: dict, message: str) -> None:
    """``trial`` (RUNNING; its sweep locked) has a straggler, as a job's (``states.jobs.record_straggler``): ``entry``
    (rank, ratio, epoch, step...) added to its ``stragglers``, a history row (reason ``straggler``). Never commits."""
    from orchestrator.states.jobs import STRAGGLER  # beside the other request reasons a trial shares with a job

    def add(_session: Session, _change: Change) -> None:
        trial.stragglers = [*(trial.stragglers or []), entry]  # a new list: the JSON column sees the change

    record_request(session, TRIAL_LIFECYCLE, trial, STRAGGLER, message, add)
