"""The Ray clusters behind the control plane (docs/clusters.md): ``/v1/clusters``, cluster-wide admins only. Which
projects may use a cluster is set on the project: ``PUT /v1/projects/{id}/clusters`` (api/routers/projects.py)."""

from __future__ import annotations

import logging

from fastapi import APIRouter, status

from api.deps import ClusterAdminKey, ControlPlaneDep, SessionDep
from orchestrator.control_plane import ControlPlane
from orchestrator.errors import NotFound
from orchestrator.repositories import clusters as clusters_repo
from orchestrator.use_cases import clusters
from orchestrator_contract.rest import ClusterCreate, ClusterOut, ClusterPatch

log = logging.getLogger(__name__)

router = APIRouter(prefix="/v1/clusters", tags=["clusters"])


def refresh_backends(service: ControlPlane) -> None:
    """After a committed cluster write: this replica's backends follow it now (the others at their next tick)."""
    if service.backends is None:  # not started (no loops, no Ray): nothing to refresh
        return
    try:
        service.backends.refresh()
    except Exception:  # the write is committed; the loops refresh again on their next tick
        log.warning("could not refresh the cluster backends after a cluster write", exc_info=True)


@router.post("", status_code=status.HTTP_201_CREATED, summary="Register a Ray cluster")
def create_cluster(
    body: ClusterCreate, session: SessionDep, service: ControlPlaneDep, _: ClusterAdminKey
) -> ClusterOut:
    """Cluster-wide admins: register a Ray cluster by its dashboard URL and where its token is read (never the
    token itself). A taken name, or an address already registered, is 409. No project uses it until one is bound
    to it (``PUT /v1/projects/{id}/clusters``)."""
    cluster = clusters.create_cluster(session, body, service.settings.cluster_token_dir)
    view = clusters.cluster_view(session, cluster)
    session.commit()
    refresh_backends(service)
    return view


@router.get("", summary="List the Ray clusters")
def list_clusters(session: SessionDep, _: ClusterAdminKey) -> list[ClusterOut]:
    """Cluster-wide admins: every registered cluster by name, with the projects bound to each and what its tenancy
    means for them (``trust``)."""
    return clusters.cluster_views(session, clusters_repo.list_clusters(session))


@router.get("/{name}", summary="Get a Ray cluster")
def get_cluster(name: str, session: SessionDep, _: ClusterAdminKey) -> ClusterOut:
    """Cluster-wide admins: the cluster, the projects bound to it and what its tenancy means for them."""
    cluster = clusters_repo.get_cluster(session, name)
    if cluster is None:
        raise NotFound(f"no cluster named {name!r}")
    return clusters.cluster_view(session, cluster)


@router.patch("/{name}", summary="Change a Ray cluster")
def update_cluster(
    name: str, body: ClusterPatch, session: SessionDep, service: ControlPlaneDep, _: ClusterAdminKey
) -> ClusterOut:
    """Cluster-wide admins: change the fields given (the name never changes). Making it dedicated while two or more
    projects are bound to it is 409, and so is changing the default cluster's address or token (they come from the
    service's settings) or making it dedicated."""
    cluster = clusters.update_cluster(session, name, body, service.settings.cluster_token_dir)
    view = clusters.cluster_view(session, cluster)
    session.commit()
    refresh_backends(service)
    return view


@router.delete("/{name}", status_code=status.HTTP_204_NO_CONTENT, summary="Forget a Ray cluster")
def delete_cluster(name: str, session: SessionDep, service: ControlPlaneDep, _: ClusterAdminKey) -> None:
    """Cluster-wide admins: the control plane stops driving the cluster (Ray itself is left running). 409 for the
    default cluster, while jobs, sweeps or deployments are still on it, or while it is a project's only cluster."""
    clusters.delete_cluster(session, name)
    session.commit()
    refresh_backends(service)
