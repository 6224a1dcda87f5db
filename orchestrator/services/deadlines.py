"""Deadlines (``max_runtime_s`` on a job, a sweep, or a sweep's base: each trial's; docs/jobs.md "Deadlines").

A run's runtime is the time it spent RUNNING, summed over its attempts, read from its state history: time
queued (a preemption included), starting or restarting is not counted, so neither the scheduler nor a lost
node eats a user's deadline. The reconciler calls ``enforce`` on every active run it looks at; a run past its
deadline is asked to checkpoint now and stop, the way a preemption asks (``states.jobs.request_deadline_stop``),
and ``services.preemption.settle`` ends it FAILED ``deadline_exceeded`` once its Ray job is gone (a run that
does not stop within ``preemption_grace_s`` has its Ray job stopped, as a preempted one does).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime

from sqlalchemy.orm import Session

from orchestrator.db.models import JobState, Sweep, Trial, TrialState, utcnow
from orchestrator.repositories import sweeps as sweeps_repo
from orchestrator.services.runs import Run, RunKind
from orchestrator.states.jobs import request_deadline_stop

log = logging.getLogger(__name__)

COUNTED = frozenset({JobState.RUNNING})  # the states whose time a deadline counts


def max_runtime_s(run: Run) -> float | None:
    """The run's deadline as its stored spec gives it (a spec stored before deadlines existed has none)."""
    value = (run.spec or {}).get("max_runtime_s")
    return None if value is None else float(value)


def stretches_in(history: Iterable, states: frozenset, now: datetime) -> list[tuple[datetime, datetime]]:
    """The stretches of time spent in ``states`` by the history rows' account (oldest first; each row's
    ``to_state`` holds from its ``created_at`` until the next row's). A request's row (from = to) changes
    nothing."""
    stretches = []
    entered: datetime | None = None
    for row in history:
        if entered is not None:
            stretches.append((entered, row.created_at))
        entered = row.created_at if row.to_state in states else None
    if entered is not None:
        stretches.append((entered, now))
    return stretches


def seconds_in(history: Iterable, states: frozenset, now: datetime) -> float:
    """Seconds spent in ``states`` by the history rows' account (``stretches_in``)."""
    return max(sum((end - start).total_seconds() for start, end in stretches_in(history, states, now)), 0.0)


def trial_runtime_s(trial_history: Iterable, sweep_history: Iterable, now: datetime) -> float:
    """A trial's runtime: the time it was RUNNING while its sweep was RUNNING too (a trial paused by its sweep's
    preemption stays RUNNING in its own history, but its sweep is QUEUED meanwhile)."""
    trial = stretches_in(trial_history, frozenset({TrialState.RUNNING}), now)
    sweep = stretches_in(sweep_history, COUNTED, now)
    overlap = 0.0
    for start, end in trial:
        for sweep_start, sweep_end in sweep:
            overlap += max((min(end, sweep_end) - max(start, sweep_start)).total_seconds(), 0.0)
    return overlap


def trials_past_deadline(
    session: Session, sweep: Sweep, trials: list[Trial] | None = None, now: datetime | None = None
) -> list[str]:
    """The Ray Tune ids of the sweep's RUNNING trials past their deadline (its base's ``max_runtime_s``): each
    such trial's rank 0 is told so (``ControlSignal.stop_trials``), checkpoints and stops, and its trial ends
    FAILED ``deadline_exceeded`` (``workers.tune.tuner.run_trial``). ``trials``: the sweep's running ones, when the
    caller has them already."""
    limit = (((sweep.spec or {}).get("base")) or {}).get("max_runtime_s")
    if limit is None or sweep.state != JobState.RUNNING:
        return []
    now = now or utcnow()
    trials = sweeps_repo.running_trials(session, sweep.id) if trials is None else trials
    running = [trial for trial in trials if trial.state == TrialState.RUNNING]
    if not running:
        return []
    sweep_history = sweeps_repo.list_events(session, sweep.id)
    histories = sweeps_repo.trial_histories(session, [trial.id for trial in running])
    return [
        trial.tune_id for trial in running if trial_runtime_s(histories[trial.id], sweep_history, now) >= float(limit)
    ]


def enforce(session: Session, kind: RunKind, run: Run, now: datetime | None = None) -> bool:
    """In the caller's transaction, ``run`` locked: ask it to checkpoint and stop if it is RUNNING past its
    deadline. True when it was asked now. A run already being stopped (a preemption, an earlier ask) is left
    alone: a preempted run comes back RUNNING later, and is asked then."""
    limit = max_runtime_s(run)
    if limit is None or run.state != JobState.RUNNING or run.preempt_requested_at is not None:
        return False
    used = seconds_in(kind.history(session, run.id), COUNTED, now or utcnow())
    if used < limit:
        return False
    request_deadline_stop(
        session,
        kind.lifecycle,
        run,
        f"ran {used:.0f} s, its max_runtime_s is {limit:g} s: asked to checkpoint now and stop",
    )
    log.info("%s %s: past its deadline (%.0f s of %g s): asked to checkpoint and stop", kind.name, run.id, used, limit)
    return True
