"""Straggler detection (``failure.straggler_factor``; docs/jobs.md "Stragglers").

Rank 0 sends every rank's own time per step with each metric window (``MetricsEvent.rank_step_s``). A rank
above ``straggler_factor`` times the other ranks' median for ``ORCHESTRATOR_STRAGGLER_WINDOWS`` windows in a row is a
straggler: the job's ``stragglers`` names it (with how much slower, since which step) and a history row says so,
once per rank and attempt (``states.jobs.record_straggler``), and its node is blamed (``services.bad_nodes``); a new
attempt starts with none. The count of slow windows in a row per rank is kept on the job (``straggler_windows``), so
nothing is held in memory.
"""

from __future__ import annotations

import logging
import statistics

from sqlalchemy.orm import Session

from orchestrator.db.models import Job, JobState
from orchestrator.services import bad_nodes
from orchestrator.services.hangs import world_size
from orchestrator.services.preemption import attempts_used
from orchestrator.services.runs import JOBS
from orchestrator.states.jobs import record_straggler, request_straggler_restart

log = logging.getLogger(__name__)

DEFAULT_FACTOR = 1.5
DEFAULT_WINDOWS = 3  # ORCHESTRATOR_STRAGGLER_WINDOWS


def observe(session: Session, job: Job, step: int, rank_step_s: list[float], windows: int) -> None:
    """In the caller's transaction, ``job`` locked: one window's times by rank; flags the ranks that have been
    slow for ``windows`` windows in a row."""
    if job.state != JobState.RUNNING or len(rank_step_s) < 2:
        return
    times = rank_step_s[: world_size(job)]
    factor = float(((job.spec or {}).get("failure") or {}).get("straggler_factor", DEFAULT_FACTOR))
    counts = dict(job.straggler_windows or {})
    flagged = {entry["rank"] for entry in job.stragglers or []}
    for rank, seconds in enumerate(times):
        # Against the other ranks: with 2 ranks a median over all would be their mean, which no rank can pass twice.
        median = statistics.median(times[:rank] + times[rank + 1 :])
        if median <= 0:
            continue
        ratio = seconds / median
        counts[str(rank)] = counts.get(str(rank), 0) + 1 if ratio > factor else 0
        if counts[str(rank)] >= windows and rank not in flagged:
            entry = {"rank": rank, "ratio": round(ratio, 2), "step_s": seconds, "median_s": median, "step": step}
            record_straggler(
                session,
                job,
                entry,
                f"rank {rank} is a straggler: {ratio:.1f}x the other ranks' median time per step of its own ({seconds:.3f} s "
                f"vs {median:.3f} s: its data and its forward pass) for {windows} metric windows in a row, at step "
                f"{step}",
            )
            log.warning("job %s: rank %d is a straggler (%.1fx the median)", job.id, rank, ratio)
            bad_nodes.record_fault(session, job, rank, bad_nodes.STRAGGLER, f"rank {rank}: {ratio:.1f}x the median")
            _restart_if_asked(session, job, rank)
    job.straggler_windows = counts


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
