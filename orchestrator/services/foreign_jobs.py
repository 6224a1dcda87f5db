"""Ray jobs the control plane did not submit ("foreign"), told apart from its own by asking its database, never by
the look of a submission id: the scheduler counts what they hold against their cluster (it does not over-admit
because of them), and ``GET /v1/cluster`` lists them for admins (docs/clusters.md).

Ours is a submission ``<run id>-<attempt>`` of a job or sweep this database holds, on that cluster, at an attempt
it has reached. Ray refuses a second submission with an id it knows, so code on a shared cluster cannot pass its
own job off as one of ours: a run's past attempts are taken, and its future ones or another cluster's runs do not
count as ours. A driver that connected to Ray itself is always foreign.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestrator.admission import reserved_by
from orchestrator.backend import RayJob
from orchestrator.services.runs import KINDS


def foreign_jobs(session: Session, live: Mapping[str, list[RayJob]], default_cluster: str) -> dict[str, list[RayJob]]:
    """``live``: each cluster's live Ray jobs; returns each cluster's foreign ones (at most one query per kind of
    run, none when no submission looks like one of ours)."""
    claimed = {run_id for jobs in live.values() for job in jobs if (run_id := _run_and_attempt(job.submission_id)[0])}
    ours: dict[str, tuple[int, str]] = {}  # run id -> (attempt reached, cluster)
    if claimed:
        for kind in KINDS:
            model = kind.model
            for run_id, attempt, cluster in session.execute(
                select(model.id, model.attempt, model.cluster).where(model.id.in_(claimed))
            ):
                ours[run_id] = (attempt, cluster or default_cluster)
    foreign: dict[str, list[RayJob]] = {}
    for cluster, jobs in live.items():
        foreign[cluster] = [job for job in jobs if not _is_ours(job, cluster, ours)]
    return foreign


def held_by(jobs: Iterable[RayJob]) -> dict[str, float]:
    """The CPUs and GPUs ``jobs`` hold together."""
    return reserved_by(job.holds for job in jobs)


def _is_ours(job: RayJob, cluster: str, ours: Mapping[str, tuple[int, str]]) -> bool:
    run_id, attempt = _run_and_attempt(job.submission_id)
    if run_id is None or run_id not in ours:
        return False
    reached, its_cluster = ours[run_id]
    return its_cluster == cluster and 1 <= attempt <= reached


def _run_and_attempt(submission_id: str | None) -> tuple[str | None, int]:
    run_id, _, attempt = (submission_id or "").rpartition("-")
    if not run_id or not attempt.isdigit():
        return None, 0
    return run_id, int(attempt)
