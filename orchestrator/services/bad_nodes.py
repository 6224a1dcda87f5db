"""Bad nodes (docs/jobs.md "Bad nodes"): a Ray node blamed for ``bad_node_faults`` hangs or stragglers within
``bad_node_window_s`` is kept out of placement for ``bad_node_cooldown_s`` after its last fault, as Determined's
``exclude_node`` did.

- blamed: the node of a straggler rank (``services.stragglers``), of each rank of a hung attempt that was not
  waiting in a collective or did not answer (``services.hangs``), from the ranks' node ids rank 0 reported with
  ``running`` (``Job.rank_nodes``) once the reconciler found each of them in Ray's list of the job's Train
  workers' nodes (``verify_rank_nodes``); a rank on no confirmed node blames nothing;
- kept out: a job's next attempt is handed the bad nodes that are alive (``DriverAssignment.avoid_nodes``) and
  its driver places its workers elsewhere (a Ray label selector on ``ray.io/node-id``), as long as the other alive
  nodes can hold the job: else it is placed on them all rather than wait for ever;
- shown in ``GET /v1/cluster`` and cleared by a cluster admin (``DELETE /v1/cluster/bad-nodes/{node_id}``): its
  faults are marked cleared, never deleted.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestrator.admission import Demand
from orchestrator.backend import BackendUnavailable, ClusterNode
from orchestrator.backend.registry import ClusterBackends
from orchestrator.db.models import Job, NodeFault, Sweep, utcnow
from orchestrator.settings import Settings

log = logging.getLogger(__name__)

HUNG, STRAGGLER = "hung", "straggler"


@dataclass(frozen=True)
class BadNode:
    node_id: str
    excluded_until: datetime
    faults: list[NodeFault]


def node_of_rank(job: Job, rank: int) -> str | None:
    """The Ray node id of ``rank`` in the job's current attempt, if rank 0 reported it and Ray confirmed it."""
    reported = job.rank_nodes or {}
    nodes = reported.get("nodes") or []
    if reported.get("attempt") != job.attempt or not reported.get("verified") or not 0 <= rank < len(nodes):
        return None
    return nodes[rank] or None


def needs_verifying(job: Job) -> bool:
    """Rank 0 reported where the current attempt's ranks run and Ray has not been asked yet."""
    reported = job.rank_nodes or {}
    return reported.get("attempt") == job.attempt and not reported.get("verified")


def verify_rank_nodes(job: Job, ray_nodes: set[str]) -> None:
    """Keep of the reported nodes those Ray lists the job's Train workers on (the run's word alone blames no node:
    docs/security.md); a node Ray does not confirm becomes unknown, which blames nothing."""
    if not needs_verifying(job):
        return
    reported = list(job.rank_nodes.get("nodes") or [])
    unconfirmed = sorted({node for node in reported if node not in ray_nodes})
    if unconfirmed:
        log.warning("job %s reported ranks on nodes Ray does not list for it: %s", job.id, unconfirmed)
    nodes = [node if node in ray_nodes else "" for node in reported]
    job.rank_nodes = {"attempt": job.attempt, "nodes": nodes, "verified": True}


def record_fault(session: Session, job: Job, rank: int, kind: str, message: str) -> NodeFault | None:
    """In the caller's transaction: blame ``rank``'s node for a hang or a straggler (nothing if its node is
    unknown, or already blamed for this attempt and kind: one fault per node per attempt and kind)."""
    node_id = node_of_rank(job, rank)
    if node_id is None:
        return None
    already = session.scalar(
        select(NodeFault.id).where(
            NodeFault.node_id == node_id,
            NodeFault.job_id == job.id,
            NodeFault.attempt == job.attempt,
            NodeFault.kind == kind,
        )
    )
    if already is not None:
        return None
    fault = NodeFault(node_id=node_id, kind=kind, job_id=job.id, attempt=job.attempt, message=message[:1000])
    session.add(fault)
    log.warning("node %s blamed for a %s: job %s attempt %d rank %d", node_id, kind, job.id, job.attempt, rank)
    return fault


def bad_nodes(session: Session, settings: Settings, now: datetime | None = None) -> list[BadNode]:
    """The nodes kept out of placement at ``now``, by node id."""
    now = now or utcnow()
    window, cooldown = timedelta(seconds=settings.bad_node_window_s), timedelta(seconds=settings.bad_node_cooldown_s)
    since = now - cooldown - window  # older faults cannot keep a node out any more
    faults = session.scalars(
        select(NodeFault)
        .where(NodeFault.created_at >= since, NodeFault.cleared_at.is_(None))
        .order_by(NodeFault.created_at, NodeFault.id)
    ).all()
    by_node: dict[str, list[NodeFault]] = {}
    for fault in faults:
        by_node.setdefault(fault.node_id, []).append(fault)
    found = []
    for node_id, node_faults in sorted(by_node.items()):
        until = excluded_until([f.created_at for f in node_faults], settings.bad_node_faults, window, cooldown)
        if until is not None and until > now:
            found.append(BadNode(node_id, until, node_faults))
    return found


def excluded_until(times: list[datetime], faults: int, window: timedelta, cooldown: timedelta) -> datetime | None:
    """``times`` oldest first: when the exclusion they earn ends (``cooldown`` after the last fault of the newest
    run of ``faults`` faults within ``window``), or None if no such run."""
    for last in range(len(times) - 1, faults - 2, -1):
        if times[last] - times[last - faults + 1] <= window:
            return times[last] + cooldown
    return None


def nodes_to_avoid(
    session: Session, settings: Settings, backends: ClusterBackends, job: Job | Sweep, demand: Demand
) -> list[str]:
    """What a new attempt of ``job`` (or of a sweep: its trials) must not be placed on (``DriverAssignment`` and
    ``SweepAssignment.avoid_nodes``): the bad nodes, and with ``failure.on_straggler: restart`` the nodes the job
    itself straggled on, that are alive; unless the other alive nodes cannot hold ``demand`` (the run would wait
    for ever: it is placed on them all instead); none while Ray does not answer."""
    bad = {node.node_id for node in bad_nodes(session, settings)} | straggled_on(session, job)
    if not bad:
        return []
    try:
        alive = backends.of(job, session).nodes()  # node ids are its cluster's
    except BackendUnavailable as exc:
        log.warning("bad nodes not avoided: the Ray cluster does not answer: %s", exc)
        return []
    return avoid_nodes(bad, alive, demand)


def straggled_on(session: Session, job: Job | Sweep) -> set[str]:
    """The nodes ``job`` had a straggler on (faults not cleared), when its policy is to restart away from them."""
    if ((job.spec or {}).get("failure") or {}).get("on_straggler") != "restart":
        return set()
    return set(
        session.scalars(
            select(NodeFault.node_id).where(
                NodeFault.job_id == job.id, NodeFault.kind == STRAGGLER, NodeFault.cleared_at.is_(None)
            )
        )
    )


def avoid_nodes(bad: set[str], alive: list[ClusterNode], demand: Demand) -> list[str]:
    """The ``bad`` nodes among ``alive``, if the rest hold ``demand`` (in all, and its largest worker on one node)."""
    avoided = [node.node_id for node in alive if node.node_id in bad]
    rest = [node for node in alive if node.node_id not in bad]
    held = {name: sum(node.total.get(name, 0.0) for node in rest) for name in demand.total}
    fits_one = any(all(node.total.get(k, 0.0) >= v for k, v in demand.per_worker.items()) for node in rest)
    if avoided and not (fits_one and all(held[name] >= need for name, need in demand.total.items())):
        log.warning(
            "bad nodes %s not avoided: the other %d alive nodes cannot hold %s", avoided, len(rest), demand.what
        )
        return []
    return avoided


def clear(session: Session, node_id: str, cleared_by: str, now: datetime | None = None) -> int:
    """Mark the node's faults cleared (a cluster admin's call); returns how many."""
    now = now or utcnow()
    faults = session.scalars(select(NodeFault).where(NodeFault.node_id == node_id, NodeFault.cleared_at.is_(None)))
    count = 0
    for fault in faults:
        fault.cleared_at, fault.cleared_by = now, cleared_by
        count += 1
    return count
