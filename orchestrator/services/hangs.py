"""Hang detection (``failure.hang_timeout_s`` on a job; docs/jobs.md "Hangs").

A RUNNING job whose reported progress (a metric point, a committed checkpoint of its current attempt) has not
advanced for its hang timeout is suspected hung. The reconciler calls ``watch`` on every active job it looks at:

1. suspected: every rank is asked for its Python stack (``states.jobs.request_stacks``; the ranks' control poll
   sees ``stacks_wanted`` and answers with a ``StacksEvent``, printed in the attempt's log as well);
2. every rank answered, or ``hang_stacks_wait_s`` passed: ``watch`` returns the verdict, and the reconciler stops
   the attempt's Ray job and ends the attempt ``hung``: a new attempt from the latest checkpoint while
   ``retries.max_attempts`` last, FAILED ``hung`` after;
3. progress arrived meanwhile: not hung after all, the suspicion is cleared (a ``progress_resumed`` row).

The clock is the control plane's own: the arrival of the run's reports, never a time the run claims.
"""

from __future__ import annotations

import itertools
import logging
import statistics
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from orchestrator.db.models import Job, JobState, utcnow
from orchestrator.repositories import jobs as jobs_repo
from orchestrator.settings import Settings
from orchestrator.states.jobs import HUNG, clear_hang_suspicion, request_stacks

log = logging.getLogger(__name__)

MEDIAN_FACTOR = 20  # "auto": this many median report intervals ...
LONGEST_FACTOR = 2  # ... or twice the longest one so far (start-up, a checkpoint's write) ...
STARTUP_FACTOR = 3  # ... and before an attempt's first report (no median yet), this many floors
MAX_STACK_CHARS = 4000  # of each rank's stacks kept on the job (the attempt's log has them whole)


def timeout_s(job: Job, progress: list[datetime], running_since: datetime, floor_s: float) -> float | None:
    """The job's hang timeout: its spec's seconds, None when off, or "auto" (the default, also for a spec stored
    before hang detection) from the arrival times of this attempt's reports."""
    return timeout_of(job.spec or {}, progress, running_since, floor_s)


def timeout_of(spec: dict, progress: list[datetime], running_since: datetime, floor_s: float) -> float | None:
    """``timeout_s`` of a run's spec (a job's, or a sweep trial's: its base with the trial's config)."""
    value = (spec.get("failure") or {}).get("hang_timeout_s", "auto")
    if value != "auto":
        return None if value is None else float(value)
    if not progress:
        return STARTUP_FACTOR * floor_s
    times = [running_since, *progress]
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(times)]
    between_reports = gaps[1:]  # the first gap is the attempt's start-up
    median = statistics.median(between_reports) if between_reports else 0.0
    return max(floor_s, MEDIAN_FACTOR * median, LONGEST_FACTOR * max(gaps))


@dataclass(frozen=True)
class Hung:
    """The verdict: the attempt is hung; ``message`` names the ranks in a collective, elsewhere and silent."""

    reason: str
    message: str
    blamed: tuple[int, ...] = ()  # the ranks not waiting in a collective, or silent: their nodes are blamed


def watch(
    session: Session, job: Job, settings: Settings, watching_since: datetime, now: datetime | None = None
) -> Hung | None:
    """In the caller's transaction, ``job`` locked: suspect it, clear it or judge it (see the module). A job that
    is not RUNNING, or is being stopped (a preemption, its deadline), is left alone. ``watching_since``: when
    this control plane started; no job is judged on a silence that began before (its reports may have waited
    for the control plane to come back)."""
    if job.state != JobState.RUNNING or job.preempt_requested_at is not None:
        return None
    now = now or utcnow()
    running_since = jobs_repo.last_transition(session, job.id).created_at  # entered RUNNING
    progress = jobs_repo.progress_of_attempt(session, job.id, job.attempt)
    last = max([running_since, *progress, watching_since])
    if job.stacks_requested_at is not None:
        if last > job.stacks_requested_at:
            clear_hang_suspicion(session, job, "progress again after its stacks were asked for: not hung")
            log.info("job %s: progress again, not hung", job.id)
            return None
        answered = job.stacks or {}
        waited = (now - job.stacks_requested_at).total_seconds()
        if len(answered) < world_size(job) and waited < settings.hang_stacks_wait_s:
            return None
        return Hung(HUNG, verdict(job, answered, (now - last).total_seconds()), blamed_ranks(job, answered))
    limit = timeout_s(job, progress, running_since, settings.hang_timeout_floor_s)
    idle = (now - last).total_seconds()
    if limit is None or idle < limit:
        return None
    request_stacks(
        session,
        job,
        f"no progress for {idle:.0f} s (its hang timeout is {limit:g} s): asked every rank for its Python stack",
    )
    log.warning(
        "job %s: no progress for %.0f s (hang timeout %g s): asking every rank for its stack", job.id, idle, limit
    )
    return None


def record_stacks(job: Job, answer: dict) -> bool:
    """Keep one rank's answer (a ``StacksEvent`` as a dict) if it answers the request still open from a rank the
    job has; True if kept. Each rank's stacks are kept to their last ``MAX_STACK_CHARS`` (the log has them whole),
    so a row holds at most world size x that."""
    return keep_answer(job, answer, world_size(job))


def keep_answer(run: Any, answer: dict, ranks_in_run: int) -> bool:
    """``record_stacks`` for a row with ``stacks_requested_at`` and ``stacks`` (a job, a sweep trial) of
    ``ranks_in_run`` ranks."""
    if run.stacks_requested_at is None or answer.get("request") != run.stacks_requested_at.isoformat():
        return False
    if not 0 <= answer["rank"] < ranks_in_run:
        return False
    answered = dict(run.stacks or {})
    kept = {key: answer[key] for key in ("node", "pid", "in_collective", "where", "worker") if key in answer}
    answered[str(answer["rank"])] = {**kept, "stacks": answer["stacks"][-MAX_STACK_CHARS:]}
    run.stacks = answered  # a new dict: the JSON column sees the change
    return True


def stacks_request_id(job: Job) -> str | None:
    """The control signal's ``stacks_wanted``: the open request's time (a new request, a new value)."""
    return None if job.stacks_requested_at is None else job.stacks_requested_at.isoformat()


def verdict(job: Job, answered: dict, idle_s: float) -> str:
    """What the hung attempt's end says: how long without progress, and each rank's place."""
    step = (job.latest_metrics or {}).get("step")
    return ranks_verdict(world_size(job), answered, idle_s, "" if step is None else f"step {step}")


def ranks_verdict(ranks_in_run: int, answered: dict, idle_s: float, last_reported: str = "") -> str:
    """``verdict`` for a run of ``ranks_in_run`` ranks (a job's attempt, a sweep trial) whose last report was at
    ``last_reported`` ("step 12", "epoch 3")."""
    ranks = _by_rank(answered)
    collective = [_rank_at(r, a) for r, a in ranks if a.get("in_collective")]
    elsewhere = [(r, a) for r, a in ranks if not a.get("in_collective")]
    silent = [str(r) for r in range(ranks_in_run) if str(r) not in answered]
    lines = [f"hung: no progress for {idle_s:.0f} s" + (f" (last reported {last_reported})" if last_reported else "")]
    if collective:
        lines.append(f"in a collective (waiting for the others): {', '.join(collective)}")
    if elsewhere:
        lines.append("elsewhere: " + "; ".join(f"{_rank_at(r, a)} at {a.get('where') or '?'}" for r, a in elsewhere))
    if silent:
        lines.append(f"no stack from rank {', '.join(silent)} (its process is gone, or holds the GIL)")
    for rank, answer in elsewhere[:2]:  # the likely culprits' stacks; every rank's is in the attempt's log
        lines.append(f"--- rank {rank}'s stack ---\n{answer.get('stacks') or ''}")
    return "\n".join(lines)


def blamed_ranks(job: Job, answered: dict) -> tuple[int, ...]:
    """The ranks a hang is blamed on (``services.bad_nodes``): those that answered from outside a collective and
    those that did not answer; none when every rank waits in a collective (no rank explains it)."""
    return tuple(
        rank
        for rank in range(world_size(job))
        if str(rank) not in answered or not answered[str(rank)].get("in_collective")
    )


def _rank_at(rank: int, answer: dict) -> str:
    return f"rank {rank} (node {answer.get('node') or '?'}, pid {answer.get('pid') or '?'})"


def _by_rank(answered: dict) -> list[tuple[int, dict]]:
    return sorted((int(rank), answer) for rank, answer in answered.items())


def world_size(job: Job) -> int:
    """The job's number of ranks, as its stored spec (defaults filled in) gives it."""
    return int(((job.spec or {}).get("scaling") or {}).get("num_workers", 1))
