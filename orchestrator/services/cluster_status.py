"""``GET /v1/cluster``: the cluster's resources as the scheduler reckons them, and the caller's jobs."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace

from sqlalchemy.orm import Session

from orchestrator.admission import ClusterCapacity, free_of, reserved_by
from orchestrator.backend import BackendUnavailable, ClusterBackend, RayJob
from orchestrator.backend.registry import ClusterBackends
from orchestrator.repositories import clusters as clusters_repo
from orchestrator.repositories import jobs as jobs_repo
from orchestrator.scheduling.quotas import serving_holdings
from orchestrator.services.bad_nodes import bad_nodes
from orchestrator.services.foreign_jobs import foreign_jobs, held_by
from orchestrator.services.runs import active_runs
from orchestrator.settings import Settings
from orchestrator_contract.rest import (
    BadNodeOut,
    ClusterHealthOut,
    ClusterStatus,
    ForeignJobOut,
    NodeFaultOut,
    QueuedJobOut,
)

log = logging.getLogger(__name__)

QUEUE_LIMIT = 100  # jobs listed in ``queue``; the count of QUEUED jobs covers every one


def cluster_status(
    session: Session, backends: ClusterBackends, project_scope: str | None, settings: Settings
) -> ClusterStatus:
    """Ray's total and what is free for new runs (the total less what active jobs, sweeps and deployments hold:
    the same arithmetic as the scheduler's), with the job counts and the queue of ``project_scope`` (None: all),
    and the bad nodes kept out of placement (``services.bad_nodes``). The top-level resources are the default
    cluster's; ``clusters`` lists every cluster the scope may use (docs/clusters.md), each with what Ray jobs the
    control plane did not submit hold there (the jobs themselves listed only to a cluster admin: ``project_scope``
    None). A cluster that does not answer is ``ray="unavailable"`` with empty resources, never an error."""
    held = held_by_cluster(session, backends.default_name)
    if project_scope is None:
        visible = [(e.name, e.labels) for e in backends.refresh(session)]
    else:
        visible = [(c.name, dict(c.labels or {})) for c in clusters_repo.usable_clusters(session, project_scope)]
    if backends.default_name not in {name for name, _ in visible} and project_scope is None:
        visible.insert(0, (backends.default_name, {}))
    default_name = backends.default_name
    reached = {name: _backend(name, backends, session) for name in {name for name, _ in visible} | {default_name}}
    # Ray is asked with no transaction open: on SQLite an open one holds the write lock (BEGIN IMMEDIATE), and
    # every writer (the scheduler, the runs' events) would wait for the slowest cluster to answer. Nothing was
    # written: what was read is in plain values above.
    session.rollback()
    observed = {name: _observe(name, backend) for name, backend in reached.items()}
    foreign = foreign_jobs(session, {name: seen.live for name, seen in observed.items() if seen.live}, default_name)

    queued = clusters_repo.queued_on(session)

    def health(name: str, labels: dict, list_foreign: bool) -> ClusterHealthOut:
        out = _health(
            name, labels, observed[name], foreign.get(name, []), held.get(name, ([], 0)), default_name, list_foreign
        )
        return out.model_copy(update={"queued": queued.get(name, 0)})

    clusters = [health(name, labels, list_foreign=project_scope is None) for name, labels in visible]
    default = next((c for c in clusters if c.is_default), None) or health(default_name, {}, list_foreign=False)
    return ClusterStatus(
        ray=default.ray,
        total=default.total,
        available=default.available,
        jobs=jobs_repo.count_by_state(session, project_scope),
        queue=[QueuedJobOut.model_validate(j) for j in jobs_repo.queued_in_scope(session, project_scope, QUEUE_LIMIT)],
        queue_limit=QUEUE_LIMIT,
        bad_nodes=bad_nodes_seen_by(session, settings, project_scope),
        clusters=clusters,
    )


def held_by_cluster(session: Session, default: str) -> dict[str, tuple[list[dict[str, float]], int]]:
    """{cluster: (what its active runs and live deployments hold, how many runs are active on it)}."""
    held: dict[str, tuple[list[dict[str, float]], int]] = {}
    for run in active_runs(session):
        demands, running = held.get(run.cluster or default, ([], 0))
        held[run.cluster or default] = ([*demands, dict(run.request)], running + 1)
    for holding in serving_holdings(session):
        demands, running = held.get(holding.cluster or default, ([], 0))
        held[holding.cluster or default] = ([*demands, dict(holding.request)], running)
    return held


@dataclass(frozen=True)
class _Observed:
    """One cluster as its Ray answered just now: None when it did not."""

    capacity: ClusterCapacity | None
    nodes: int = 0
    live: list[RayJob] = field(default_factory=list)


def _backend(name: str, backends: ClusterBackends, session: Session) -> ClusterBackend | BackendUnavailable:
    try:
        return backends.get(name, session)
    except BackendUnavailable as exc:
        return exc


def _observe(name: str, backend: ClusterBackend | BackendUnavailable) -> _Observed:
    try:
        if isinstance(backend, BackendUnavailable):
            raise backend
        capacity, nodes = backend.capacity(), len(backend.nodes())
    except BackendUnavailable as exc:
        log.warning("cluster status: cluster %s does not answer: %s", name, exc)  # hosts stay in the log
        return _Observed(None)
    try:
        live = backend.live_jobs()
    except BackendUnavailable as exc:
        log.warning("cluster status: could not list the Ray jobs of cluster %s: %s", name, exc)
        live = []
    return _Observed(capacity, nodes, live)


def _health(
    name: str,
    labels: dict,
    observed: _Observed,
    foreign: list[RayJob],
    held: tuple[list[dict[str, float]], int],
    default: str,
    list_foreign: bool,
) -> ClusterHealthOut:
    demands, running = held
    outside = {r: amount for r, amount in held_by(foreign).items() if amount}
    if observed.capacity is None:
        ray, total, available = "unavailable", {}, {}
    else:
        capacity = replace(observed.capacity, held_outside=outside)
        ray, total, available = "ok", dict(capacity.total), free_of(capacity, reserved_by(demands))
    return ClusterHealthOut(
        name=name,
        is_default=name == default,
        labels={str(k): str(v) for k, v in labels.items()},
        ray=ray,
        nodes=observed.nodes,
        total=total,
        available=available,
        running=running,
        held_outside=outside,
        foreign=[
            ForeignJobOut(id=job.name, kind=job.kind, status=job.status, entrypoint=job.entrypoint, holds=job.holds)
            for job in foreign
        ]
        if list_foreign
        else [],
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
