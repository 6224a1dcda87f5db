"""Job state rules and the ONE function that changes a job's state.

Every writer (the API, the scheduler, the reconciler, the events endpoint) goes through
``set_job_state``: it locks the row, checks the transition against the rules, appends a history row
and updates the job. Nothing else assigns ``Job.state``.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestrator.db.models import Job, JobEvent, JobState, utcnow

S = JobState
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
    Rule(frozenset({S.STARTING}), frozenset({S.RUNNING, S.RESTARTING, S.SUCCEEDED, S.FAILED, S.CANCELLING, S.CANCELLED})),
    Rule(frozenset({S.RUNNING}), frozenset({S.RESTARTING, S.SUCCEEDED, S.FAILED, S.CANCELLING})),
    # RESTARTING -> RESTARTING: a second failure before the job ran again (recorded with again=True).
    Rule(frozenset({S.RESTARTING}), frozenset({S.RESTARTING, S.RUNNING, S.SUCCEEDED, S.FAILED, S.CANCELLING})),
    Rule(frozenset({S.CANCELLING}), frozenset({S.CANCELLED, S.SUCCEEDED})),
)


def is_allowed(from_state: JobState, to_state: JobState) -> bool:
    return allowed(RULES, from_state, to_state)


class IllegalTransition(Exception):
    def __init__(self, job_id: str, from_state: JobState, to_state: JobState):
        super().__init__(f"job {job_id} cannot go from {from_state} to {to_state}")
        self.from_state = from_state
        self.to_state = to_state


def lock_job(session: Session, job_id: str) -> Job | None:
    """Load a job with its row locked for the rest of the transaction (SQLite: BEGIN IMMEDIATE)."""
    return session.scalars(
        select(Job).where(Job.id == job_id).with_for_update().execution_options(populate_existing=True)
    ).one_or_none()


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
    if job.state == to_state and not again:
        return False
    if not is_allowed(job.state, to_state):
        raise IllegalTransition(job.id, job.state, to_state)
    session.add(
        JobEvent(
            job_id=job.id,
            from_state=job.state,
            to_state=to_state,
            reason=reason,
            message=message,
            attempt=job.attempt,
        )
    )
    now = utcnow()
    if to_state == S.RUNNING and job.started_at is None:
        job.started_at = now
    if to_state in TERMINAL:
        job.finished_at = now
    job.state = to_state
    job.reason = reason
    job.message = message
    job.updated_at = now
    return True


def note_waiting(job: Job, reason: str, message: str) -> None:
    """Say why a job stays where it is (e.g. QUEUED for resources): no transition, no history row."""
    if (job.reason, job.message) != (reason, message):
        job.reason = reason
        job.message = message
