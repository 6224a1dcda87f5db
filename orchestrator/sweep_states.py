"""Sweep and trial state rules, and the ONE function that changes each.

A sweep follows a job's lifecycle and rules (``orchestrator.states.RULES``): QUEUED -> STARTING ->
RUNNING <-> RESTARTING -> SUCCEEDED | FAILED | CANCELLED, with CANCELLING between a cancel and the end.
When a sweep ends, every trial still open ends with it (CANCELLED), in the same transaction.

Trials have their own states, as Ray Tune reports them:

    PENDING -> RUNNING | FAILED | CANCELLED
    RUNNING -> SUCCEEDED | STOPPED | FAILED | CANCELLED     STOPPED: stopped early by the scheduler
    SUCCEEDED, STOPPED, FAILED, CANCELLED are final
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestrator.db.models import JobState, Sweep, SweepEvent, Trial, TrialState
from orchestrator.states import TERMINAL, Rule, lock_row, set_run_state, transition

T = TrialState
TRIAL_TERMINAL: frozenset[TrialState] = frozenset({T.SUCCEEDED, T.STOPPED, T.FAILED, T.CANCELLED})
TRIAL_RULES: tuple[Rule, ...] = (
    Rule(frozenset({T.PENDING}), frozenset({T.RUNNING, T.FAILED, T.CANCELLED})),
    Rule(frozenset({T.RUNNING}), frozenset({T.SUCCEEDED, T.STOPPED, T.FAILED, T.CANCELLED})),
)


def lock_sweep(session: Session, sweep_id: str) -> Sweep | None:
    return lock_row(session, Sweep, sweep_id)


def set_sweep_state(
    session: Session, sweep: Sweep, to_state: JobState, reason: str, message: str = "", again: bool = False
) -> bool:
    """Move a locked sweep to ``to_state`` and record why (see ``orchestrator.states.set_job_state``).
    A sweep that ends takes its open trials with it. Never commits."""
    changed = set_run_state(
        session,
        sweep,
        to_state,
        reason,
        message,
        again=again,
        subject=f"sweep {sweep.id}",
        history=lambda: SweepEvent(
            sweep_id=sweep.id,
            from_state=sweep.state,
            to_state=to_state,
            reason=reason,
            message=message,
            attempt=sweep.attempt,
        ),
    )
    if changed and to_state in TERMINAL:
        open_trials = session.scalars(
            select(Trial).where(Trial.sweep_id == sweep.id, Trial.state.not_in(TRIAL_TERMINAL))
        )
        for trial in open_trials:
            set_trial_state(trial, T.CANCELLED, "sweep_ended", f"the sweep ended {to_state} ({reason})")
    return changed


def set_trial_state(trial: Trial, to_state: TrialState, reason: str, message: str = "") -> bool:
    """Move a trial (its sweep's row locked by the caller) to ``to_state``. Never commits."""
    changed = transition(
        None, trial, to_state, reason, message, rules=TRIAL_RULES, subject=f"trial {trial.id}", history=None
    )
    if changed and to_state == TrialState.RUNNING and trial.started_at is None:
        trial.started_at = trial.updated_at
    if changed and to_state in TRIAL_TERMINAL:
        trial.finished_at = trial.updated_at
    return changed
