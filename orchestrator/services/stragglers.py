"""Straggler detection (``failure.straggler_factor``; docs/jobs.md "Stragglers"), for jobs and sweep trials.

A job's rank 0 sends every rank's own time per step with each metric window (``MetricsEvent.rank_step_s``); a
trial's with each epoch result (``TrialEvent.rank_step_s``: a trial's windows are its epochs). A rank above
``straggler_factor`` times the other ranks' median for ``ORCHESTRATOR_STRAGGLER_WINDOWS`` windows in a row is a
straggler (``flag``, one rule for both): the run's ``stragglers`` names it (with how much slower, since which step)
and a history row says so, once per rank (a job's: per attempt, ``states.jobs.record_straggler``; a trial's:
``states.sweeps.record_trial_straggler``). A job's straggler also blames its node (``services.bad_nodes``) and, with
``failure.on_straggler: restart``, restarts the job; a trial's only warns (the control plane does not know a trial's
nodes, and a sweep refuses ``restart``). The count of slow windows in a row per rank is kept on the row
(``straggler_windows``), so nothing is held in memory.
"""

from __future__ import annotations

import logging
import statistics

from sqlalchemy.orm import Session

from orchestrator.db.models import Job, JobState, Trial, TrialState
from orchestrator.services import bad_nodes
from orchestrator.services.hangs import world_size
from orchestrator.services.preemption import attempts_used
from orchestrator.services.runs import JOBS
from orchestrator.states.jobs import record_straggler, request_straggler_restart
from orchestrator.states.sweeps import record_trial_straggler
from orchestrator_contract.jobs import JobSpec

log = logging.getLogger(__name__)

DEFAULT_FACTOR = 1.5
DEFAULT_WINDOWS = 3  # ORCHESTRATOR_STRAGGLER_WINDOWS


def flag(run: Job | Trial, rank_step_s: list[float], ranks: int, factor: float, windows: int) -> list[dict]:
    """One window's times by rank on ``run`` (a job or a trial, locked; ``ranks`` of them): each rank's count of
    slow windows in a row (``straggler_windows``) updated; returns the ranks slow for ``windows`` windows in a row and
    not flagged before (rank, ratio, its seconds per step and the others' median), for the caller to record."""
    times = rank_step_s[:ranks]
    if len(times) < 2:
        return []
    counts = dict(run.straggler_windows or {})
    flagged = {entry["rank"] for entry in run.stragglers or []}
    found = []
    for rank, seconds in enumerate(times):
        # Against the other ranks: with 2 ranks a median over all would be their mean, which no rank can pass twice.
        median = statistics.median(times[:rank] + times[rank + 1 :])
        if median <= 0:
            continue
        ratio = seconds / median
        counts[str(rank)] = counts.get(str(rank), 0) + 1 if ratio > factor else 0
        if counts[str(rank)] >= windows and rank not in flagged:
            found.append({"rank": rank, "ratio": round(ratio, 2), "step_s": seconds, "median_s": median})
    run.straggler_windows = counts  # a new dict: the JSON column sees the change
    return found


def factor_of(spec: dict | JobSpec) -> float:
    """``failure.straggler_factor`` of a job's stored spec (a dict) or of a trial's spec."""
    if isinstance(spec, JobSpec):
        return spec.failure.straggler_factor
    return float(((spec or {}).get("failure") or {}).get("straggler_factor", DEFAULT_FACTOR))


def observe(session: Session, job: Job, step: int, rank_step_s: list[float], windows: int) -> None:
    """In the caller's transaction, ``job`` locked: one metric window's times by rank; flags the ranks that have
    been slow for ``windows`` windows in a row."""
    if job.state != JobState.RUNNING:
        return
    for entry in flag(job, rank_step_s, world_size(job), factor_of(job.spec), windows):
        rank, ratio, seconds, median = entry["rank"], entry["ratio"], entry["step_s"], entry["median_s"]
        record_straggler(
            session,
            job,
            {**entry, "step": step},
            f"rank {rank} is a straggler: {ratio:.1f}x the other ranks' median time per step of its own ({seconds:.3f} s "
            f"vs {median:.3f} s: its data and its forward pass) for {windows} metric windows in a row, at step "
            f"{step}",
        )
        log.warning("job %s: rank %d is a straggler (%.1fx the median)", job.id, rank, ratio)
        bad_nodes.record_fault(session, job, rank, bad_nodes.STRAGGLER, f"rank {rank}: {ratio:.1f}x the median")
        _restart_if_asked(session, job, rank)


def observe_trial(
    session: Session, trial: Trial, spec: JobSpec, epoch: int, step: int, rank_step_s: list[float], windows: int
) -> None:
    """In the caller's transaction, the trial's sweep locked: one epoch's times by rank of ``trial`` (whose job is
    ``spec``: its sweep's base with its config); flags the ranks that have been slow for ``windows`` epochs in a
    row. A warning only: no node is blamed, nothing restarts."""
    if trial.state != TrialState.RUNNING:
        return
    for entry in flag(trial, rank_step_s, spec.scaling.num_workers, factor_of(spec), windows):
        rank, ratio, seconds, median = entry["rank"], entry["ratio"], entry["step_s"], entry["median_s"]
        record_trial_straggler(
            session,
            trial,
            {**entry, "epoch": epoch, "step": step},
            f"rank {rank} is a straggler: {ratio:.1f}x the other ranks' median time per step of its own ({seconds:.3f} s "
            f"vs {median:.3f} s: its data and its forward pass) for {windows} epochs in a row, at epoch {epoch} "
            f"(step {step})",
        )
        log.warning("trial %s: rank %d is a straggler (%.1fx the median)", trial.id, rank, ratio)


def _restart_if_asked(session: Session, job: Job, rank: int) -> None:
    """``failure.on_straggler: restart``: ask the job to checkpoint now and stop, for a next attempt placed without
    the straggler's node (``services.bad_nodes``), while its attempts last and nothing else is stopping it."""
    failure = (job.spec or {}).get("failure") or {}
    if failure.get("on_straggler", "warn") != "restart" or job.preempt_requested_at is not None:
        return
    max_attempts, used = JOBS.max_attempts(job), attempts_used(job)
    if used >= max_attempts:
        log.warning("job %s: a straggler, but no attempts left to restart with (%d of %d)", job.id, used, max_attempts)
        return
    node = bad_nodes.node_of_rank(job, rank)
    where = f"node {node}" if node else "its node (unknown)"
    request_straggler_restart(
        session,
        job,
        f"on_straggler restart: asked to checkpoint now and stop; attempt {used + 1} of {max_attempts} will be "
        f"placed without rank {rank}'s {where} where the cluster has room elsewhere",
    )
