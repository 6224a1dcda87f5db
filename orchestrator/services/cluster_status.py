"""``GET /v1/cluster``: the cluster's resources as the scheduler reckons them, and the caller's jobs."""

from __future__ import annotations

import logging

from sqlalchemy.orm import Session

from orchestrator.admission import free_of, reserved_by
from orchestrator.backend import BackendUnavailable, ClusterBackend
from orchestrator.loops.serving import serving_reservation
from orchestrator.repositories import jobs as jobs_repo
from orchestrator.services.bad_nodes import bad_nodes
from orchestrator.services.runs import active_demands
from orchestrator.settings import Settings
from orchestrator_contract.rest import BadNodeOut, ClusterStatus, NodeFaultOut, QueuedJobOut

log = logging.getLogger(__name__)

QUEUE_LIMIT = 100  # jobs listed in ``queue``; the count of QUEUED jobs covers every one


def cluster_status(
    session: Session, backend: ClusterBackend, project_scope: str | None, settings: Settings
) -> ClusterStatus:
    """Ray's total and what is free for new runs (the total less what active jobs, sweeps and deployments hold:
    the same arithmetic as the scheduler's), with the job counts and the queue of ``project_scope`` (None: all),
    and the bad nodes kept out of placement (``services.bad_nodes``).
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
        bad_nodes=bad_nodes_seen_by(session, settings, project_scope),
    )


def bad_nodes_seen_by(session: Session, settings: Settings, project_scope: str | None) -> list[BadNodeOut]:
    """Every bad node (placement is cluster-wide), with the faults of ``project_scope``'s jobs only (None: all):
    another project's job ids and messages stay its own; ``fault_count`` counts them all."""
    found = bad_nodes(session, settings)
    visible = jobs_repo.ids_in_scope(session, {f.job_id for node in found for f in node.faults}, project_scope)
    return [
        BadNodeOut(
            node_id=node.node_id,
            excluded_until=node.excluded_until,
            fault_count=len(node.faults),
            faults=[NodeFaultOut.model_validate(fault) for fault in node.faults if fault.job_id in visible],
        )
        for node in found
    ]
