"""Preemption that checkpoints first (docs/scheduling.md): who to preempt (a pure choice), asking a job (a sweep) to
checkpoint now and stop, and finishing the preemption once its Ray job is gone.

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

Sweeps are preempted whole, through the path that already resumes a sweep whose driver was lost
    Their demand is what their concurrent trials hold (``admission.sweep_demand``), their order a job's, and
    ``preemptible: false`` on the sweep spec exempts one. Marked, the sweep answers ``checkpoint_now`` on
    ``GET /internal/v1/sweeps/{id}/control``: the driver polls it and so does every running trial's rank 0
    (the same ``ControlPoller``, the sweep's run token). Each trial's loop checkpoints at its next step and
    stops as a job's does; the trial never returns to Tune (Tune would call it finished) but leaves a marker
    and waits (``workers.tune.preemption``). Once every running trial has paused and Tune holds its last
    result, the driver interrupts Tune the way Ctrl-C does (Tune saves its experiment state with those trials
    unfinished) and exits ``DriverExit.PREEMPTED``; ``settle`` requeues the sweep as it does a job. The next
    attempt's ``Tuner.restore(resume_unfinished=True)`` starts the paused trials again under their own trial
    ids, so each Train run resumes from its preemption checkpoint; finished trials are never run again.

    Not per trial: Tune's PAUSE (a TrialScheduler deciding it) would keep the sweep running with fewer trials,
    but its pause saves a Tune checkpoint of the trial (a function trainable's would be the Train checkpoint
    handed over as a Tune one, as PBT's are), the sweep's admitted demand would have to shrink and grow with
    its paused trials, and the scheduler would need a way to give one trial's resources to the preemptor
    while the sweep keeps the rest. Whole-sweep preemption frees all that the sweep holds even when the
    preemptor needs one trial's worth (the trade-off), costs each running trial at most one repeated step
    (a PBT trial: the steps since its last epoch, as after a lost driver), and a trial that had not reached
    its first step starts it again.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from orchestrator.admission import RESOURCES
from orchestrator.backend import RunStatus
from orchestrator.db.models import Checkpoint, JobState, utcnow
from orchestrator.services.runs import JOBS, KINDS, Run, RunKind, kind_of, may_be_preempted
from orchestrator.states.jobs import DEADLINE, DEADLINE_EXCEEDED, PREEMPTED, request_preemption
from orchestrator_contract.jobs import DriverExit

log = logging.getLogger(__name__)

S = JobState
_EPS = 1e-9
# A victim in one of these may be preempted (CANCELLING is on its way out already).
PREEMPTIBLE_STATES = frozenset({S.STARTING, S.RUNNING, S.RESTARTING})
# A STARTING job whose submission Ray does not know yet may still be being submitted: wait this long
# before calling it gone (the reconciler's RESUBMIT_GRACE).
MISSING_GRACE = timedelta(seconds=10)
# How a run is named to a project that does not own it (docs/security.md): never its id or priority.
ANOTHER_PROJECTS_RUN = "a run of another project"


@dataclass(frozen=True)
class Candidate:
    """One active job or sweep that might be preempted, as the victim choice sees it."""

    id: str
    project_id: str
    priority: int
    created_at: datetime  # the youngest (newest) goes first among equals
    demand: Mapping[str, float]  # what it holds: {"CPU": .., "GPU": ..}
    preemptible: bool = True  # its spec's ``preemptible``
    borrowing: bool = False  # admitted on capacity beyond its project's quota: goes before others
    preempting: bool = False  # already asked to checkpoint and stop: its resources are on their way back
    kind: str = "job"  # RunKind.name: "job" or "sweep"

    @property
    def key(self) -> str:
        """As the scheduler's policy names runs: ``job:<id>``, ``sweep:<id>``."""
        return f"{self.kind}:{self.id}"


def victim_order(candidate: Candidate) -> tuple:
    """Lowest priority first, then borrowing before not, then youngest first (then id, for a stable order)."""
    return (candidate.priority, not candidate.borrowing, -candidate.created_at.timestamp(), candidate.key)


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


def preemptor_named(kind: str, run_id: str, priority: int, project_id: str, victim_project_id: str) -> str:
    """The preemptor as its victim's message and ``last_preempted_by`` name it: a run of the victim's own project
    by kind, id and priority ("job 1f2e (priority 10)"); a run of another project only as that, so a project
    never learns another's run ids or priorities (the cause, fair share or quota, is added by ``preempt``)."""
    if project_id == victim_project_id:
        return f"{kind} {run_id} (priority {priority})"
    return ANOTHER_PROJECTS_RUN


def victims_named(victims: Iterable[Candidate], project_id: str) -> str:
    """The victims as the preemptor's waiting message names them: its own project's by key ("job:1f2e"),
    another project's only by count."""
    victims = list(victims)
    own = [v.key for v in victims if v.project_id == project_id]
    others = len(victims) - len(own)
    if others:
        own.append(ANOTHER_PROJECTS_RUN if others == 1 else f"{others} runs of other projects")
    return ", ".join(own)


def preemption_candidates(session: Session) -> list[Candidate]:
    """Every job and sweep that is STARTING, RUNNING or RESTARTING, with what it holds (a sweep: its concurrent
    trials, as admitted)."""
    return [
        Candidate(
            id=run.id,
            project_id=run.project_id,
            priority=run.priority,
            created_at=run.created_at,
            demand=kind.demand(run).total,
            preemptible=may_be_preempted(run.spec),
            borrowing=bool(run.borrowing),
            preempting=run.preempt_requested_at is not None,
            kind=kind.name,
        )
        for kind in KINDS
        for run in kind.active(session)
        if run.state in PREEMPTIBLE_STATES
    ]


def kind_named(name: str) -> RunKind:
    return next(kind for kind in KINDS if kind.name == name)


def mark_preempted(session: Session, run: Run, by: str, reason: str) -> bool:
    """In the caller's transaction, ``run`` (a job or a sweep) locked: ask it to checkpoint now and stop. False
    (nothing changed) when it is not active, is being cancelled, is not preemptible or is already being
    preempted."""
    if run.state not in PREEMPTIBLE_STATES or not may_be_preempted(run.spec) or run.preempt_requested_at is not None:
        return False
    request_preemption(session, kind_of(run).lifecycle, run, f"{by} ({reason})" if reason else by)
    return True


def preempt(sessions: sessionmaker[Session], victim_id: str, by: str, reason: str, kind: RunKind = JOBS) -> bool:
    """Ask ``victim_id`` (a job, or a sweep with ``kind=SWEEPS``) to checkpoint now and stop, in a transaction of
    its own; ``by`` names the preemptor for its message (e.g. "job 1f2e (priority 10)"), ``reason`` the trigger
    ("priority", "fair_share", "quota"). Never calls Ray: the reconciler finishes it. False if it was not marked."""
    with sessions.begin() as session:
        run = kind.lock(session, victim_id)
        if run is None or not mark_preempted(session, run, by, reason):
            return False
    log.info("%s %s: preempted by %s (%s): asked to checkpoint now and stop", kind.name, victim_id, by, reason)
    return True


def checkpoint_step(session: Session, job_id: str) -> int | None:
    """The step of the job's latest recorded checkpoint, if any."""
    return session.scalar(select(func.max(Checkpoint.step)).where(Checkpoint.job_id == job_id))


def _resumes(session: Session, kind: RunKind, run: Run) -> str:
    if kind is not JOBS:
        return "its unfinished trials resume from their latest checkpoints, its finished ones are kept,"
    step = checkpoint_step(session, run.id)
    return f"resumes from its checkpoint at step {step}" if step else "starts over (no checkpoint yet)"


def _kept(session: Session, kind: RunKind, run: Run) -> str:
    if kind is not JOBS:
        return "its finished trials and every checkpoint are kept"
    step = checkpoint_step(session, run.id)
    return f"its checkpoints are kept, the latest at step {step}" if step else "it had taken no checkpoint"


def settle(
    session: Session,
    run: Run,
    status: RunStatus,
    grace_s: float,
    now: datetime | None = None,
    exit_code: int | None = None,
    kind: RunKind = JOBS,
) -> bool:
    """The reconciler's part, ``run`` (a job, or a sweep with ``kind=SWEEPS``) locked and marked: back to QUEUED
    once its Ray job is gone (its driver's ``exit_code`` says whether it checkpointed first:
    ``DriverExit.PREEMPTED``); FAILED ``deadline_exceeded`` instead when it was stopped at its deadline
    (``services.deadlines``). Returns True when its Ray job must be stopped now (STARTING: nothing to
    checkpoint yet; past the grace: it did not stop by itself)."""
    now = now or utcnow()
    at_deadline = run.preempt_by == DEADLINE
    if status == RunStatus.SUCCEEDED:
        # Its driver exited 0: the run finished before it heard of the preemption (a preempted driver exits
        # DriverExit.PREEMPTED), and its own "succeeded" report was lost. Done, not requeued.
        before = "its deadline's stop" if at_deadline else "the preemption"
        kind.set_state(session, run, S.SUCCEEDED, "completed", f"the driver exited successfully before {before}")
        return False
    requested = run.preempt_requested_at
    since = (now - requested).total_seconds() if requested is not None else 0.0
    if stopped(session, kind, run, status, now):
        how = "checkpointed and stopped" if exit_code == DriverExit.PREEMPTED else "stopped"
        if at_deadline:
            kind.set_state(
                session,
                run,
                S.FAILED,
                DEADLINE_EXCEEDED,
                f"past its max_runtime_s: {how} {since:.1f} s after it was asked; {_kept(session, kind, run)}",
            )
            return False
        kind.set_state(
            session,
            run,
            S.QUEUED,
            PREEMPTED,
            f"preempted by {run.preempt_by or 'the scheduler'}: {how} after {since:.1f} s; "
            f"{_resumes(session, kind, run)} when admitted again (not counted against retries.max_attempts)",
        )
        return False
    return run.state == S.STARTING or since > grace_s


def stopped(session: Session, kind: RunKind, run: Run, status: RunStatus, now: datetime | None = None) -> bool:
    """Whether the run's Ray job is gone: finished, or unknown to Ray for a while after its last move."""
    now = now or utcnow()
    return status.finished or (
        status == RunStatus.MISSING and now - kind.last_transition(session, run.id).created_at > MISSING_GRACE
    )


def attempts_used(run) -> int:
    """Attempts of a job (or sweep) counted against ``retries.max_attempts``: those that followed a
    preemption are not."""
    return run.attempt - (getattr(run, "preemptions", 0) or 0)
