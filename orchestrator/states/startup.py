"""Start-up timelines (docs/jobs.md "Start-up timeline"): when each stage of an attempt's start was reached, from
its admission to its first training step, kept on the run (``Job.startup``, ``Sweep.startup``: ``{attempt: {stage:
ISO time}}``; ``Trial.startup``: ``{stage: ISO time}``). A companion field like ``queued_at``: the state engine
marks ``admitted`` when an attempt begins (``startup_after``), the control plane the stages it sees itself
(Ray took the submission, the driver claimed and fetched), and a run's ``StartupEvent`` the rest. Every time is the
control plane's own (an event's arrival); the first mark of a stage counts, so a re-sent event changes nothing.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from orchestrator.db.models import JobState, Trial, utcnow
from orchestrator.states.core import Change

ATTEMPTS_KEPT = 20  # a run restarted more often keeps its latest attempts' timelines


def mark(run: Any, stage: str, at: datetime | None = None) -> bool:
    """``run`` (a job or a sweep, locked by the caller) reached ``stage`` in its current attempt at ``at`` (now).
    True when recorded; False for a stage already recorded, or a run not yet admitted."""
    if run.attempt < 1:
        return False
    attempts = dict(run.startup or {})
    stages = dict(attempts.get(str(run.attempt)) or {})
    if stage in stages:
        return False
    stages[stage] = (at or utcnow()).isoformat()
    attempts[str(run.attempt)] = stages
    for old in sorted(attempts, key=int)[:-ATTEMPTS_KEPT]:
        del attempts[old]
    run.startup = attempts  # a new dict: the JSON column sees the change
    return True


def mark_trial(trial: Trial, stage: str, at: datetime | None = None) -> bool:
    """``trial`` (its sweep locked) reached ``stage`` at ``at`` (now); the first time counts."""
    stages = dict(trial.startup or {})
    if stage in stages:
        return False
    stages[stage] = (at or utcnow()).isoformat()
    trial.startup = stages
    return True


def startup_after(_session: Session, change: Change) -> None:
    """After ``attempt_after``: an attempt that begins (admission, or a restart into a new driver) is ``admitted``."""
    admitted = change.from_state == JobState.QUEUED and change.to_state == JobState.STARTING
    if admitted or change.new_attempt:
        mark(change.row, "admitted", change.at)
