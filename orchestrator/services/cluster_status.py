"""``GET /v1/cluster``: the cluster's resources as the scheduler reckons them, and the caller's jobs."""

from __future__ import annotations

import logging

from sqlalchemy.orm import Session

from orchestrator.admission import free_of, reserved_by
from orchestrator.backend import BackendUnavailable, ClusterBackend
from orchestrator.loops.serving import serving_reservation
from orchestrator.repositories import jobs as jobs_repo
from orchestrator.services.runs import active_demands
from orchestrator_contract.rest import ClusterStatus, QueuedJobOut

log = logging.getLogger(__name__)

QUEUE_LIMIT = 100  # jobs listed in ``queue``; the count of QUEUED jobs covers every one


def cluster_status(session: Session, backend: ClusterBackend, project_scope: str | None) -> ClusterStatus:
    """Ray's total and what is free for new runs (the total less what active jobs, sweeps and deployments hold:
    the same arithmetic as the scheduler's), with the job counts and the queue of ``project_scope`` (None: all).
    A cluster that does not answer is ``ray="unavailable"`` with empty resources, never an error."""
    reserved = reserved_by([*active_demands(session), serving_reservation(session)])
    try:
        capacity = backend.capacity()
    except BackendUnavailable as exc:
        log.warning("cluster status: the Ray cluster does not answer: %s", exc)  # hosts stay in the log
        ray, total, available = "unavailable", {}, {}
    else:
        ray, total, available = "ok", dict(capacity.total), free_of(capacity, reserved)
    return ClusterStatus(
        ray=ray,
        total=total,
        available=available,
        jobs=jobs_repo.count_by_state(session, project_scope),
        queue=[QueuedJobOut.model_validate(j) for j in jobs_repo.queued_in_scope(session, project_scope, QUEUE_LIMIT)],
        queue_limit=QUEUE_LIMIT,
    )
