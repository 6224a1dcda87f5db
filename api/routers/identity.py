"""Who is calling (``GET /v1/whoami``) and what the cluster is doing for them (``GET /v1/cluster``, and a cluster
admin clearing a bad node)."""

from __future__ import annotations

from fastapi import APIRouter, status

from api.deps import ClusterAdminKey, ControlPlaneDep, CurrentKey, SessionDep
from orchestrator.errors import NotFound
from orchestrator.repositories import projects as projects_repo
from orchestrator.services import bad_nodes
from orchestrator.services.cluster_status import cluster_status
from orchestrator_contract.rest import ClusterStatus, WhoAmI

router = APIRouter(prefix="/v1", tags=["identity"])


@router.get("/whoami", summary="The calling key")
def whoami(session: SessionDep, principal: CurrentKey) -> WhoAmI:
    """The key's id, name, role and project, and whether it is a cluster-wide admin. The environment's admin
    token (ORCHESTRATOR_ADMIN_TOKEN) is no stored key: its key and project fields are null."""
    key = projects_repo.get_api_key(session, principal.key_id) if principal.key_id else None
    project = projects_repo.get_project(session, principal.project_id) if principal.project_id else None
    return WhoAmI(
        key_id=principal.key_id,
        key_name=key.name if key is not None else None,
        role=principal.role,
        project_id=principal.project_id,
        project_name=project.name if project is not None else None,
        cluster_admin=principal.is_cluster_admin,
        expires_at=key.expires_at if key is not None else None,
    )


@router.get("/cluster", summary="Cluster resources, job counts and the queue")
def cluster(session: SessionDep, service: ControlPlaneDep, principal: CurrentKey) -> ClusterStatus:
    """Ray's total and available resources (what the scheduler reckons free), how many of the key's jobs are
    in each state, and its queued jobs in admission order with why each waits (cluster-wide admins: every
    project's). 200 with `ray: "unavailable"` and empty resources when the Ray cluster does not answer."""
    return cluster_status(session, service.backends, principal.project_scope(), service.settings)


@router.delete(
    "/cluster/bad-nodes/{node_id}",
    status_code=status.HTTP_204_NO_CONTENT,
    summary="Put a bad node back into placement",
)
def clear_bad_node(node_id: str, session: SessionDep, principal: ClusterAdminKey) -> None:
    """A cluster-wide admin's call: the node's hangs and stragglers are marked cleared (kept, with who cleared
    them) and jobs are placed on it again from their next attempt. 404 when it has no fault to clear."""
    if not bad_nodes.clear(session, node_id, principal.key_id or "admin token"):
        raise NotFound(f"node {node_id} has no hang or straggler to clear")
    session.commit()
