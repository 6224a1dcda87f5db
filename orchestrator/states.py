"""Job state rules and the ONE function that changes a job's state.

Every writer (the API, the scheduler, the reconciler, the events endpoint) goes through
``set_job_state``: it locks the row, checks the transition against the rules, appends a history row
and updates the job. Nothing else assigns ``Job.state``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestrator.db.models import Job, JobEvent, JobState, utcnow

S = JobState
T = TypeVar("T")
TERMINAL: frozenset[JobState] = frozenset({S.SUCCEEDED, S.FAILED, S.CANCELLED})
ACTIVE: frozenset[JobState] = frozenset({S.STARTING, S.RUNNING, S.RESTARTING, S.CANCELLING})


@dataclass(frozen=True)
class Rule:
    """FROM -> TO: any state of ``from_states`` may move to any of ``to_states`` (jobs, deployments)."""

    from_states: frozenset
    to_states: frozenset


def allowed(rules: tuple[Rule, ...], from_state, to_state) -> bool:
    return any(from_state in r.from_states and to_state in r.to_states for r in rules)


# FROM -> TO. A CANCELLING job may still finish on its own (SUCCEEDED), but a failure reported while
# it is being stopped is the stop itself, so CANCELLING -> FAILED is not a rule: it ends CANCELLED.
RULES: tuple[Rule, ...] = (
    Rule(frozenset({S.QUEUED}), frozenset({S.STARTING, S.CANCELLED, S.FAILED})),
    Rule(
        frozenset({S.STARTING}), frozenset({S.RUNNING, S.RESTARTING, S.SUCCEEDED, S.FAILED, S.CANCELLING, S.CANCELLED})
    ),
    Rule(frozenset({S.RUNNING}), frozenset({S.RESTARTING, S.SUCCEEDED, S.FAILED, S.CANCELLING})),
    # RESTARTING -> RESTARTING: a second failure before the job ran again (recorded with again=True).
    Rule(frozenset({S.RESTARTING}), frozenset({S.RESTARTING, S.RUNNING, S.SUCCEEDED, S.FAILED, S.CANCELLING})),
    Rule(frozenset({S.CANCELLING}), frozenset({S.CANCELLED, S.SUCCEEDED})),
)


def is_allowed(from_state: JobState, to_state: JobState) -> bool:
    return allowed(RULES, from_state, to_state)


class IllegalTransition(Exception):
    def __init__(self, subject: str, from_state, to_state):
        super().__init__(f"{subject} cannot go from {from_state} to {to_state}")
        self.from_state = from_state
        self.to_state = to_state


def lock_job(session: Session, job_id: str) -> Job | None:
    """Load a job with its row locked for the rest of the transaction (SQLite: BEGIN IMMEDIATE)."""
    return lock_row(session, Job, job_id)


def lock_row(session: Session, model: type[T], row_id: str) -> T | None:
    """Load a row by id, locked for the rest of the transaction (SQLite: BEGIN IMMEDIATE)."""
    return session.scalars(
        select(model).where(model.id == row_id).with_for_update().execution_options(populate_existing=True)
    ).one_or_none()


def transition(
    session: Session,
    row: Any,
    to_state,
    reason: str,
    message: str,
    *,
    rules: tuple[Rule, ...],
    subject: str,
    history: Callable[[], Any] | None,
    again: bool = False,
) -> bool:
    """The common core of every kind's one transition function (jobs, sweeps, trials).

    ``row`` (locked by the caller) has ``state``, ``reason``, ``message`` and ``updated_at``. Returns False,
    changing nothing, when it is already in ``to_state`` unless ``again`` says the repeat is news. Raises
    IllegalTransition for a move ``rules`` forbid. ``history`` makes the history row (read before the
    change: it records the state left). Never commits.
    """
    if row.state == to_state and not again:
        return False
    if not allowed(rules, row.state, to_state):
        raise IllegalTransition(subject, row.state, to_state)
    if history is not None:
        session.add(history())
    row.state = to_state
    row.reason = reason
    row.message = message
    row.updated_at = utcnow()
    return True


def set_job_state(
    session: Session,
    job: Job,
    to_state: JobState,
    reason: str,
    message: str = "",
    again: bool = False,
) -> bool:
    """Move ``job`` (already locked with ``lock_job``) to ``to_state`` and record why.

    Returns False, changing nothing, when the job is already there (events are retried, so a repeat
    is normal) unless ``again`` says the repeat is itself news (a second restart). Raises
    IllegalTransition for a move the rules forbid. Never commits: the caller's transaction covers the
    job, its history row and whatever else the caller changed with it.
    """
    return set_run_state(
        session,
        job,
        to_state,
        reason,
        message,
        again=again,
        subject=f"job {job.id}",
        history=lambda: JobEvent(
            job_id=job.id,
            from_state=job.state,
            to_state=to_state,
            reason=reason,
            message=message,
            attempt=job.attempt,
        ),
    )


def set_run_state(
    session: Session,
    run: Any,
    to_state: JobState,
    reason: str,
    message: str,
    *,
    again: bool,
    subject: str,
    history: Callable[[], Any],
) -> bool:
    """A job's or a sweep's transition under the job rules, with the lifecycle's timestamps."""
    changed = transition(
        session, run, to_state, reason, message, rules=RULES, subject=subject, history=history, again=again
    )
    if changed and to_state == S.RUNNING and run.started_at is None:
        run.started_at = run.updated_at
    if changed and to_state in TERMINAL:
        run.finished_at = run.updated_at
        # A run's token acts for that run only while it runs: its driver has sent its last word.
        run.token_hash = ""
    return changed


def note_waiting(job: Job, reason: str, message: str) -> None:
    """Say why a job stays where it is (e.g. QUEUED for resources): no transition, no history row."""
    if (job.reason, job.message) != (reason, message):
        job.reason = reason
        job.message = message
