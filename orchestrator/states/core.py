"""The state engine's core: one transition function and one creation record for every kind of row.

A ``Lifecycle`` describes one kind (jobs, sweeps, trials, deployments): its FROM -> TO ``Rule``s, its
initial and terminal states, how its history row is made, and its companion hooks, the fields that change
together with the state (attempt, timestamps, version pointers, ...). ``transition`` is the only code that
assigns a row's ``state``: it checks the rules, runs the ``before`` hooks, appends the history row, updates
the row and runs the ``after`` hooks, all in the caller's transaction (the row locked with ``lock_row``).
Like Prefect's orchestration rules, a kind's policy is data (rules + hooks) that one function applies.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, TypeVar

from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestrator.db.models import utcnow
from orchestrator.errors import Conflict

E = TypeVar("E", bound=enum.Enum)  # a kind's state enum
T = TypeVar("T")  # an ORM model


@dataclass(frozen=True)
class Rule(Generic[E]):
    """FROM -> TO: any state of ``from_states`` may move to any of ``to_states``."""

    from_states: frozenset[E]
    to_states: frozenset[E]


def allowed(rules: tuple[Rule, ...], from_state: Any, to_state: Any) -> bool:
    return any(from_state in r.from_states and to_state in r.to_states for r in rules)


class IllegalTransition(Conflict):
    """A move the kind's rules forbid; nothing was changed (a 409 if it ever reaches the API)."""

    def __init__(self, subject: str, from_state: Any, to_state: Any):
        super().__init__(f"{subject} cannot go from {from_state} to {to_state}")
        self.from_state = from_state
        self.to_state = to_state


@dataclass(frozen=True)
class Change:
    """One transition (or a creation, ``from_state`` None) as the hooks and the history row see it."""

    row: Any
    from_state: Any
    to_state: Any
    reason: str
    message: str
    at: datetime  # the row's new updated_at, and the value of every timestamp the change sets
    new_attempt: bool = False  # the caller says this transition submits a new driver (runs only)


Hook = Callable[[Session, Change], None]


@dataclass(frozen=True)
class Lifecycle:
    """Everything the engine knows about one kind of row."""

    kind: str  # "job", "sweep", "trial", "deployment": in IllegalTransition's message
    rules: tuple[Rule, ...]
    initial: Any  # the state a new row starts in, or a frozenset of the states it may start in
    terminal: frozenset
    history: Callable[[Session, Change], Any]  # the history row of a change (the row not yet changed)
    subject: Callable[[Any], str] = field(default=lambda row: str(row.id))  # names the row in errors
    before: tuple[Hook, ...] = ()  # companion fields the history row must already see
    after: tuple[Hook, ...] = ()  # companion fields that follow the new state
    on_create: tuple[Hook, ...] = ()  # companion fields of a new row, after its creation record
    attempts: bool = False  # whether ``new_attempt`` means anything to this kind

    def allows(self, from_state: Any, to_state: Any) -> bool:
        return allowed(self.rules, from_state, to_state)


def lock_row(session: Session, model: type[T], row_id: str) -> T | None:
    """Load a row by id, locked for the rest of the transaction (SQLite: BEGIN IMMEDIATE)."""
    return session.scalars(
        select(model).where(model.id == row_id).with_for_update().execution_options(populate_existing=True)
    ).one_or_none()


def transition(
    session: Session,
    lifecycle: Lifecycle,
    row: Any,
    to_state: Any,
    reason: str,
    message: str = "",
    *,
    again: bool = False,
    new_attempt: bool = False,
) -> bool:
    """THE transition function: move ``row`` (locked by the caller) to ``to_state`` and record why.

    Returns False, changing nothing, when the row is already there (events are retried, so a repeat is
    normal) unless ``again`` says the repeat is itself news (a second restart, a newer version mid-rollout);
    ``new_attempt`` (runs only) implies ``again``. Raises IllegalTransition for a move the rules forbid.
    Never commits: the caller's transaction covers the row, its history row and whatever else it changed.
    """
    if new_attempt and not lifecycle.attempts:
        raise ValueError(f"a {lifecycle.kind} has no attempts")
    if row.state == to_state and not (again or new_attempt):
        return False
    if not lifecycle.allows(row.state, to_state):
        raise IllegalTransition(f"{lifecycle.kind} {lifecycle.subject(row)}", row.state, to_state)
    change = Change(row, row.state, to_state, reason, message, utcnow(), new_attempt)
    for hook in lifecycle.before:
        hook(session, change)
    entry = lifecycle.history(session, change)
    entry.created_at = change.at  # the history row and the companions (the usage ledger) share one instant
    session.add(entry)
    row.state = to_state
    row.reason = reason
    row.message = message
    row.updated_at = change.at
    for hook in lifecycle.after:
        hook(session, change)
    return True


def record_creation(session: Session, lifecycle: Lifecycle, row: Any, reason: str, message: str = "") -> None:
    """The history row of a new row (``from_state`` None, in its lifecycle's initial state), then its
    creation companions. The row must be flushed (it has its id). Never commits."""
    initial = lifecycle.initial
    if row.state not in (initial if isinstance(initial, frozenset) else {initial}):
        raise ValueError(f"a new {lifecycle.kind} starts {initial}, not {row.state}")
    change = Change(row, None, row.state, reason, message, row.created_at or utcnow())
    entry = lifecycle.history(session, change)
    entry.created_at = change.at
    session.add(entry)
    for hook in lifecycle.on_create:
        hook(session, change)


def record_request(session: Session, lifecycle: Lifecycle, row: Any, reason: str, message: str, apply: Hook) -> None:
    """A change that is news but no new state (a preemption asked for, a lost head's driver tokens revoked):
    ``apply`` sets its companion fields, a history row records it (from = to = the row's state, ``reason``
    among the kind's ``REQUESTS``, which ``last_transition`` skips) and the row's reason and message say it.
    Never commits."""
    change = Change(row, row.state, row.state, reason, message, utcnow())
    apply(session, change)
    entry = lifecycle.history(session, change)
    entry.created_at = change.at
    session.add(entry)
    row.reason = reason
    row.message = message
