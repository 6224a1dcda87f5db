"""Which clusters a submitted run may go to (docs/clusters.md): those its project is bound to (none bound: the
default cluster) that match its ``placement``. A placement that matches none of them is a 422 naming those it may
use: a run never goes to a cluster its project is not bound to."""

from __future__ import annotations

from sqlalchemy.orm import Session

from orchestrator.backend import ClusterBackend
from orchestrator.backend.registry import ClusterBackends
from orchestrator.repositories import clusters as clusters_repo
from orchestrator.services.submission import SpecRejected
from orchestrator_contract.placement import Placement


def clusters_for(
    session: Session,
    project_id: str,
    placement: Placement | None,
    backends: ClusterBackends,
    loc: tuple[str, ...] = ("placement",),
) -> dict[str, ClusterBackend]:
    """{name: backend} of the clusters the run may be placed on, in name order. Raises SpecRejected (422)."""
    usable = clusters_repo.usable_clusters(session, project_id)
    if not usable:  # nothing registered yet (a control plane that did not start its own cluster: tests)
        return {backends.default_name: backends.default}
    matching = [c for c in usable if placement is None or placement.matches(c.name, dict(c.labels or {}))]
    if not matching:
        offered = "; ".join(
            c.name
            + (" (" + ", ".join(f"{k}={v}" for k, v in sorted((c.labels or {}).items())) + ")" if c.labels else "")
            for c in usable
        )
        raise SpecRejected(loc, f"{placement.describe()} is not among the clusters this project may use: {offered}")
    return {c.name: backends.get(c.name, session) for c in matching}
