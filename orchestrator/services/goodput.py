"""Goodput (docs/jobs.md "Goodput"): the share of the time a job held its workers that ended up as kept training,
and where the rest went, read from its state history, its checkpoints and when its reports arrived.

- held: time STARTING, RUNNING, RESTARTING or CANCELLING (from each admission to its end; QUEUED holds nothing);
- lost, by cause:
  - start_up: STARTING (a Ray job submitted, its workers placed, the code set up);
  - restarts: RESTARTING (a worker group or a driver replaced);
  - hangs: an attempt ended ``hung``, from its last report to its end;
  - recomputed: a RUNNING stretch that ended short (a restart, a preemption, a failure), from its last committed
    checkpoint (or its start) to its end, less its hang: training the next attempt redoes, or that is lost;
  - preemption: from a preemption's (or a deadline's, or a straggler restart's) ask to the stop (the checkpoint it
    writes on the way out);
  - checkpoint_blocking: the seconds kept training stood still for a checkpoint (a synchronous write, an
    asynchronous one's snapshot), as rank 0 measured them and sent them with its next metric point; a point's
    seconds count where the point arrived, and only in a RUNNING stretch's kept part (what a stretch redoes is
    already lost as recomputed);
- kept: RUNNING time less hangs, recomputed, preemption and checkpoint blocking; goodput = kept / held.

A window [start, end) clips every stretch (``GET /v1/usage`` sums the jobs of a project, a label or a day this
way); without one the whole life counts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from datetime import datetime

from sqlalchemy.orm import Session

from orchestrator.db.models import JobState, utcnow
from orchestrator.repositories import jobs as jobs_repo
from orchestrator.states.jobs import DEADLINE_REACHED, HUNG, PREEMPTING, REQUESTS, STRAGGLER_RESTART
from orchestrator_contract.rest.jobs import GoodputOut, LostTime

S = JobState
HELD = frozenset({S.STARTING, S.RUNNING, S.RESTARTING, S.CANCELLING})
ENDS_SHORT = frozenset({S.RESTARTING, S.QUEUED, S.FAILED, S.CANCELLING, S.CANCELLED})
STOP_ASKED = frozenset({PREEMPTING, DEADLINE_REACHED, STRAGGLER_RESTART})  # requests to checkpoint now and stop


@dataclass
class Goodput:
    held_s: float = 0.0
    running_s: float = 0.0
    start_up_s: float = 0.0
    restarts_s: float = 0.0
    hangs_s: float = 0.0
    recomputed_s: float = 0.0
    preemption_s: float = 0.0
    checkpoint_blocking_s: float = 0.0

    @property
    def kept_s(self) -> float:
        lost = self.hangs_s + self.recomputed_s + self.preemption_s + self.checkpoint_blocking_s
        return max(self.running_s - lost, 0.0)

    @property
    def goodput(self) -> float | None:
        return None if self.held_s <= 0 else self.kept_s / self.held_s

    def add(self, other: Goodput) -> None:
        """Sum ``other`` into this one (jobs' goodput adds up by their seconds)."""
        for part in fields(self):
            setattr(self, part.name, getattr(self, part.name) + getattr(other, part.name))


Window = tuple[datetime, datetime] | None  # [start, end): what counts; None: everything


def _seconds(a: datetime, b: datetime, window: Window) -> float:
    """The seconds of [a, b] inside ``window``."""
    if window is not None:
        a, b = max(a, window[0]), min(b, window[1])
    return max((b - a).total_seconds(), 0.0)


def measure(
    history: Iterable,
    checkpoints_at: Iterable[datetime],
    last_report_of_attempt: dict[int, datetime],
    now: datetime,
    window: Window = None,
    blocked: Iterable[tuple[datetime, float]] = (),
) -> Goodput:
    """``history``: the job's rows oldest first (``to_state``, ``reason``, ``attempt``, ``created_at``), requests
    included; ``checkpoints_at``: when each committed checkpoint arrived; ``last_report_of_attempt``: when each
    attempt's last report (metric point or checkpoint) arrived; ``blocked``: (when a metric point arrived, the
    seconds checkpoints blocked training before it). A job still active counts up to ``now``; only what lies in
    ``window`` counts."""
    rows = list(history)
    checkpoints = sorted(checkpoints_at)
    blocked = list(blocked)
    result = Goodput()
    state, since, attempt = None, None, 0
    stop_asked: datetime | None = None
    for row in [*rows, None]:
        at = now if row is None else row.created_at
        if row is not None and row.reason in REQUESTS and row.to_state == state:
            if row.reason in STOP_ASKED and stop_asked is None:
                stop_asked = row.created_at
            continue  # a request: no new stretch
        if state is not None and since is not None:
            seconds = _seconds(since, at, window)
            if state in HELD:
                result.held_s += seconds
            if state == S.STARTING:
                result.start_up_s += seconds
            elif state == S.RESTARTING:
                result.restarts_s += seconds
            elif state == S.RUNNING:
                result.running_s += seconds
                kept_until = at
                if row is not None and row.to_state in ENDS_SHORT:
                    kept_until = _stretch_ended_short(
                        result, since, at, row, attempt, checkpoints, last_report_of_attempt, stop_asked, window
                    )
                result.checkpoint_blocking_s += sum(
                    s for arrived, s in blocked if since <= arrived <= kept_until and _inside(arrived, window)
                )
        if row is None:
            break
        if row.to_state != S.RUNNING:
            stop_asked = None
        state, since, attempt = row.to_state, row.created_at, row.attempt
    return result


def _stretch_ended_short(
    result: Goodput,
    start: datetime,
    end: datetime,
    row,
    attempt: int,
    checkpoints: list[datetime],
    last_report_of_attempt: dict[int, datetime],
    stop_asked: datetime | None,
    window: Window,
) -> datetime:
    """A RUNNING stretch from ``start`` to ``end`` that ``row`` ended short: its hang (from its last report), its
    stop when it was asked to (a preemption, a deadline: from the ask), and the training before those since its
    last checkpoint (a stop's own checkpoint, written after the ask, leaves none). Returns where its kept part
    ends."""
    trained_until = end
    if row.reason == HUNG:
        last = min(max(start, last_report_of_attempt.get(attempt, start)), end)
        result.hangs_s += _seconds(last, end, window)
        trained_until = last
    if stop_asked is not None and start <= stop_asked <= end:
        result.preemption_s += _seconds(stop_asked, end, window)
        trained_until = min(trained_until, stop_asked)
    kept_until = max([start, *(at for at in checkpoints if start <= at <= end)])
    result.recomputed_s += _seconds(kept_until, trained_until, window)
    return min(kept_until, trained_until)


def _inside(at: datetime, window: Window) -> bool:
    return window is None or window[0] <= at < window[1]


def goodput_of(session: Session, job_id: str, now: datetime | None = None) -> GoodputOut:
    """The job's goodput as ``GET /v1/jobs/{id}/goodput`` answers it."""
    evidence = jobs_repo.goodput_evidence(session, [job_id])
    return as_out(measure_jobs(evidence, [(job_id, None)], now or utcnow()))


def measure_jobs(
    evidence: Mapping[str, jobs_repo.GoodputEvidence], jobs: Iterable[tuple[str, Window]], now: datetime
) -> Goodput:
    """The sum of jobs' goodput, each clipped to its window: ``(job id, window)`` pairs (a job may come more
    than once, e.g. once a day), measured from ``evidence`` (``repositories.jobs.goodput_evidence``, read once
    for them all by the caller)."""
    total = Goodput()
    for job_id, window in jobs:
        found = evidence[job_id]
        total.add(measure(found.history, found.checkpoints, found.last_report_of_attempt, now, window, found.blocked))
    return total


def as_out(measured: Goodput) -> GoodputOut:
    return GoodputOut(
        goodput=measured.goodput,
        held_s=measured.held_s,
        running_s=measured.running_s,
        kept_s=measured.kept_s,
        lost=LostTime(
            start_up_s=measured.start_up_s,
            restarts_s=measured.restarts_s,
            hangs_s=measured.hangs_s,
            recomputed_s=measured.recomputed_s,
            preemption_s=measured.preemption_s,
            checkpoint_blocking_s=measured.checkpoint_blocking_s,
        ),
    )
