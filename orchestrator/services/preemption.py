"""Preemption that checkpoints first (issue 20): who to preempt (a pure choice), asking a job to checkpoint
now and stop, and finishing the preemption once its Ray job is gone.

How one preemption goes
    1. ``preempt`` marks the victim (``preempt_requested_at``, ``preempt_by``) and says so in its reason
       (``preempting``); no transition yet, no Ray call. Only ACTIVE jobs that are not being cancelled and
       whose spec is ``preemptible`` (the default) can be marked.
    2. The job's rank 0 polls ``GET /internal/v1/jobs/{id}/control`` (``workers.runtime.control``) and sees
       ``checkpoint_now``; every rank agrees at the next optimizer step, the loop writes a checkpoint outside
       its schedule, waits until Ray Train has registered it, and returns; the driver exits
       ``DriverExit.PREEMPTED`` without reporting an outcome.
    3. The reconciler (``settle``) sees the marked job's Ray job finished (any status) and moves the job back
       to QUEUED, reason ``preempted``, message naming by whom; a STARTING victim (no loop yet), or one
       that has not stopped within ``preemption_grace_s``, has its Ray job stopped first. While a victim is
       marked, a "failed" or "restarting" its driver reports is the stop itself and is ignored.
    4. Admission starts its next attempt, which resumes from its latest checkpoint (Ray Train's
       ``get_checkpoint`` under the same run name): the preemption checkpoint, so at most the step in
       flight is run again. Attempts that follow a preemption are not counted against
       ``retries.max_attempts`` (``job.preemptions``; ``attempts_used``).

Sweeps are not preempted (a sweep's trials would need Tune to pause them): ``preemption_candidates`` lists
jobs only.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from orchestrator.admission import RESOURCES, scaling_demand
from orchestrator.backend import RunStatus
from orchestrator.db.models import Checkpoint, Job, JobState, utcnow
from orchestrator.repositories import jobs as jobs_repo
from orchestrator.states.jobs import PREEMPTED, lock_job, note_waiting, set_job_state
from workers.contract.jobs import DriverExit, ScalingSpec

log = logging.getLogger(__name__)

S = JobState
_EPS = 1e-9
# A victim in one of these may be preempted (CANCELLING is on its way out already).
PREEMPTIBLE_STATES = frozenset({S.STARTING, S.RUNNING, S.RESTARTING})
PREEMPTING = "preempting"  # the reason of a marked job while it checkpoints and stops
# A STARTING job whose submission Ray does not know yet may still be being submitted: wait this long
# before calling it gone (the reconciler's RESUBMIT_GRACE).
MISSING_GRACE = timedelta(seconds=10)


@dataclass(frozen=True)
class Candidate:
    """One active job that might be preempted, as the victim choice sees it."""

    id: str
    project_id: str
    priority: int
    created_at: datetime  # the youngest (newest) goes first among equals
    demand: Mapping[str, float]  # what it holds: {"CPU": .., "GPU": ..}
    preemptible: bool = True  # its spec's ``preemptible``
    borrowing: bool = False  # admitted on capacity beyond its project's quota: goes before others
    preempting: bool = False  # already asked to checkpoint and stop: its resources are on their way back


def victim_order(candidate: Candidate) -> tuple:
    """Lowest priority first, then borrowing before not, then youngest first (then id, for a stable order)."""
    return (candidate.priority, not candidate.borrowing, -candidate.created_at.timestamp(), candidate.id)


def _fits(need: Mapping[str, float], free: Mapping[str, float]) -> bool:
    return all(need.get(r, 0.0) <= free.get(r, 0.0) + _EPS for r in RESOURCES)


def _plus(free: Mapping[str, float], demand: Mapping[str, float]) -> dict[str, float]:
    return {r: free.get(r, 0.0) + demand.get(r, 0.0) for r in RESOURCES}


def choose_victims(
    need: Mapping[str, float], free: Mapping[str, float], candidates: Iterable[Candidate]
) -> list[Candidate] | None:
    """The jobs to preempt so that a run needing ``need`` fits, ``free`` being what is free now. Pure.

    ``candidates`` are the eligible ones (the caller filters: same project and lower priority, a project
    over its share, ...). Never a non-preemptible one. Those already ``preempting`` count as freed and are
    not chosen again. Returns None when the run would not fit even with every preemptible candidate gone
    (preempt nobody for it), [] when nothing new is needed (it fits, or the preemptions under way free
    enough), else the fewest the order gives: lowest priority, then borrowing, then youngest, skipping any
    that frees nothing still missing, then dropping any the others make unnecessary.
    """
    pool = [c for c in candidates if c.preemptible]
    freed = dict(free)
    for candidate in pool:
        if candidate.preempting:
            freed = _plus(freed, candidate.demand)
    if _fits(need, freed):
        return []
    everything = freed
    for candidate in pool:
        if not candidate.preempting:
            everything = _plus(everything, candidate.demand)
    if not _fits(need, everything):
        return None
    chosen: list[Candidate] = []
    for candidate in sorted((c for c in pool if not c.preempting), key=victim_order):
        missing = {r for r in RESOURCES if need.get(r, 0.0) > freed.get(r, 0.0) + _EPS}
        if not any(candidate.demand.get(r, 0.0) > _EPS for r in missing):
            continue  # frees nothing this run still lacks
        chosen.append(candidate)
        freed = _plus(freed, candidate.demand)
        if _fits(need, freed):
            break
    # Only enough: a victim taken early whose share the later ones cover is spared (the most precious
    # first: the last in victim order).
    for candidate in sorted(chosen, key=victim_order, reverse=True):
        without = {r: freed[r] - candidate.demand.get(r, 0.0) for r in RESOURCES}
        if _fits(need, without):
            chosen.remove(candidate)
            freed = without
    return sorted(chosen, key=victim_order)


def priority_candidates(candidates: Iterable[Candidate], project_id: str, priority: int) -> list[Candidate]:
    """The trigger for priority within a project: that project's jobs of strictly lower priority."""
    return [c for c in candidates if c.project_id == project_id and c.priority < priority]


def preemptible(spec: Mapping) -> bool:
    return bool(spec.get("preemptible", True))


def preemption_candidates(session: Session) -> list[Candidate]:
    """Every job that is STARTING, RUNNING or RESTARTING (sweeps are never preempted), with what it holds."""
    query = select(Job).where(Job.state.in_(PREEMPTIBLE_STATES)).order_by(Job.created_at)
    return [
        Candidate(
            id=job.id,
            project_id=job.project_id,
            priority=job.priority,
            created_at=job.created_at,
            demand=scaling_demand(ScalingSpec.model_validate(job.spec["scaling"])).total,
            preemptible=preemptible(job.spec),
            borrowing=bool(getattr(job, "borrowing", False)),
            preempting=job.preempt_requested_at is not None,
        )
        for job in session.scalars(query)
    ]


def mark_preempted(session: Session, job: Job, by: str, reason: str) -> bool:
    """In the caller's transaction, ``job`` locked: ask it to checkpoint now and stop. False (nothing changed)
    when it is not active, is being cancelled, is not preemptible or is already being preempted."""
    if job.state not in PREEMPTIBLE_STATES or not preemptible(job.spec) or job.preempt_requested_at is not None:
        return False
    job.preempt_requested_at = utcnow()
    job.preempt_by = f"{by} ({reason})"[:256] if reason else by[:256]
    note_waiting(job, PREEMPTING, f"preempted by {job.preempt_by}: asked to checkpoint now and stop")
    return True


def preempt(sessions: sessionmaker[Session], victim_id: str, by: str, reason: str) -> bool:
    """Ask job ``victim_id`` to checkpoint now and stop, in a transaction of its own; ``by`` names the
    preemptor for its message (e.g. "job 1f2e (priority 10)"), ``reason`` the trigger ("priority",
    "fair_share", "quota"). Never calls Ray: the reconciler finishes it. False if it was not marked."""
    with sessions.begin() as session:
        job = lock_job(session, victim_id)
        if job is None or not mark_preempted(session, job, by, reason):
            return False
    log.info("job %s: preempted by %s (%s): asked to checkpoint now and stop", victim_id, by, reason)
    return True


def preempt_for(
    sessions: sessionmaker[Session],
    run_id: str,
    project_id: str,
    priority: int,
    need: Mapping[str, float],
    free: Mapping[str, float],
    candidates: Iterable[Candidate],
    trigger: str = "priority",
) -> list[str]:
    """For a queued run that does not fit: choose victims among ``candidates`` (for ``trigger="priority"``
    only its own project's lower-priority jobs are eligible) and preempt them. Returns the victims' ids
    ([] when none is needed or none would make it fit)."""
    pool = list(candidates)
    if trigger == "priority":
        pool = priority_candidates(pool, project_id, priority)
    victims = choose_victims(need, free, pool) or []
    by = f"job {run_id} (priority {priority}, project {project_id})"
    return [v.id for v in victims if preempt(sessions, v.id, by, trigger)]


def checkpoint_step(session: Session, job_id: str) -> int | None:
    """The step of the job's latest recorded checkpoint, if any."""
    return session.scalar(select(func.max(Checkpoint.step)).where(Checkpoint.job_id == job_id))


def settle(
    session: Session,
    job: Job,
    status: RunStatus,
    grace_s: float,
    now: datetime | None = None,
    exit_code: int | None = None,
) -> bool:
    """The reconciler's part, ``job`` locked and marked: back to QUEUED once its Ray job is gone (its driver's
    ``exit_code`` says whether it checkpointed first: ``DriverExit.PREEMPTED``). Returns True when its Ray
    job must be stopped now (STARTING: nothing to checkpoint yet; past the grace: it did not stop by itself)."""
    now = now or utcnow()
    if status == RunStatus.SUCCEEDED:
        # Its driver exited 0: the run finished before it heard of the preemption (a preempted driver exits
        # DriverExit.PREEMPTED), and its own "succeeded" report was lost. Done, not requeued.
        set_job_state(session, job, S.SUCCEEDED, "completed", "the driver exited successfully before the preemption")
        return False
    requested = job.preempt_requested_at
    since = (now - requested).total_seconds() if requested is not None else 0.0
    gone = status.finished or (
        status == RunStatus.MISSING and now - jobs_repo.last_transition(session, job.id).created_at > MISSING_GRACE
    )
    if gone:
        step = checkpoint_step(session, job.id)
        resume = f"resumes from its checkpoint at step {step}" if step else "starts over (no checkpoint yet)"
        stopped = "checkpointed and stopped" if exit_code == DriverExit.PREEMPTED else "stopped"
        set_job_state(
            session,
            job,
            S.QUEUED,
            PREEMPTED,
            f"preempted by {job.preempt_by or 'the scheduler'}: {stopped} after {since:.1f} s; {resume} "
            "when admitted again (not counted against retries.max_attempts)",
        )
        return False
    return job.state == S.STARTING or since > grace_s


def attempts_used(run) -> int:
    """Attempts of a job (or sweep) counted against ``retries.max_attempts``: those that followed a
    preemption are not."""
    return run.attempt - (getattr(run, "preemptions", 0) or 0)
