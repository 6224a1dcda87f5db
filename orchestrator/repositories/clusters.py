"""The registered Ray clusters and which projects may use them (docs/clusters.md). Takes a session; never commits."""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from orchestrator.db.models import (
    Cluster,
    Deployment,
    DeploymentState,
    Job,
    JobState,
    Project,
    ProjectCluster,
    Sweep,
    Tenancy,
)

_ENDED = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


def list_clusters(session: Session) -> list[Cluster]:
    return list(session.scalars(select(Cluster).order_by(Cluster.name)))


def get_cluster(session: Session, name: str) -> Cluster | None:
    return session.scalars(select(Cluster).where(Cluster.name == name)).one_or_none()


def default_cluster(session: Session) -> Cluster | None:
    return session.scalars(select(Cluster).where(Cluster.is_default.is_(True))).first()


def create_cluster(
    session: Session,
    name: str,
    address: str,
    token_ref: str | None = None,
    labels: dict | None = None,
    storage_root: str | None = None,
    tenancy: Tenancy = Tenancy.SHARED,
    is_default: bool = False,
    serve_url: str | None = None,
    serve_port: int | None = None,
) -> Cluster:
    cluster = Cluster(
        name=name,
        address=address,
        token_ref=token_ref,
        labels=dict(labels or {}),
        storage_root=storage_root,
        serve_url=serve_url,
        serve_port=serve_port,
        tenancy=tenancy,
        is_default=is_default,
    )
    session.add(cluster)
    session.flush()
    return cluster


def ensure_default_cluster(session: Session, name: str, address: str, token_ref: str | None) -> Cluster:
    """The service's own cluster (``make run``'s ``local`` or RAY_ADDRESS's), registered on first start and kept
    in line with the settings on every start (its address and token may change with them)."""
    cluster = default_cluster(session) or get_cluster(session, name)
    if cluster is None:
        return create_cluster(session, name, address, token_ref, is_default=True)
    cluster.address, cluster.token_ref, cluster.is_default = address, token_ref, True
    return cluster


def bound_cluster_ids(session: Session, project_id: str) -> list[str]:
    return list(session.scalars(select(ProjectCluster.cluster_id).where(ProjectCluster.project_id == project_id)))


def bindings(session: Session, project_ids: Iterable[str] | None = None) -> dict[str, set[str]]:
    """{project id: the names of the clusters it is bound to}; a project with none is absent (the default)."""
    query = select(ProjectCluster.project_id, Cluster.name).join(Cluster, Cluster.id == ProjectCluster.cluster_id)
    if project_ids is not None:
        query = query.where(ProjectCluster.project_id.in_(sorted(set(project_ids))))
    bound: dict[str, set[str]] = {}
    for project_id, name in session.execute(query):
        bound.setdefault(project_id, set()).add(name)
    return bound


def projects_on(session: Session, cluster_id: str) -> list[str]:
    """The ids of the projects bound to a cluster."""
    return list(session.scalars(select(ProjectCluster.project_id).where(ProjectCluster.cluster_id == cluster_id)))


def set_bindings(session: Session, project_id: str, clusters: list[Cluster]) -> None:
    session.execute(delete(ProjectCluster).where(ProjectCluster.project_id == project_id))
    for cluster in clusters:
        session.add(ProjectCluster(project_id=project_id, cluster_id=cluster.id))
    session.flush()


def usable_clusters(session: Session, project_id: str) -> list[Cluster]:
    """The clusters a project may use: those it is bound to, or else the default one."""
    ids = bound_cluster_ids(session, project_id)
    if ids:
        return list(session.scalars(select(Cluster).where(Cluster.id.in_(ids)).order_by(Cluster.name)))
    default = default_cluster(session)
    return [default] if default is not None else []


def live_work_on(session: Session, name: str) -> int:
    """Jobs and sweeps not yet ended, and live deployments, placed on the cluster: it may not be deleted then."""
    runs = sum(
        session.scalar(select(func.count()).select_from(model).where(model.cluster == name, model.state.not_in(_ENDED)))
        or 0
        for model in (Job, Sweep)
    )
    deployments = session.scalar(
        select(func.count())
        .select_from(Deployment)
        .where(Deployment.cluster == name, Deployment.state != DeploymentState.DELETED)
    )
    return runs + (deployments or 0)


def queued_on(session: Session) -> dict[str, int]:
    """{cluster: how many QUEUED jobs and sweeps wait for it} (``waiting_on``, as the scheduler last noted it)."""
    counts: dict[str, int] = {}
    for model in (Job, Sweep):
        query = (
            select(model.waiting_on, func.count())
            .where(model.state == JobState.QUEUED, model.waiting_on.is_not(None))
            .group_by(model.waiting_on)
        )
        for name, count in session.execute(query):
            counts[name] = counts.get(name, 0) + count
    return counts


def serve_urls(session: Session, default_url: str, port: int) -> dict[str | None, str]:
    """{cluster name: the base URL of its deployments}; None and the default cluster: ``default_url`` (the
    service's own Serve). Another cluster: its ``serve_url``, or its dashboard's host on its ``serve_port`` (None:
    ``port``)."""
    urls: dict[str | None, str] = {None: default_url}
    for cluster in list_clusters(session):
        if cluster.is_default:
            urls[cluster.name] = default_url
        elif cluster.serve_url:
            urls[cluster.name] = cluster.serve_url.rstrip("/")
        else:
            parts = urlsplit(cluster.address)
            urls[cluster.name] = f"{parts.scheme or 'http'}://{parts.hostname}:{cluster.serve_port or port}"
    return urls


def delete_cluster(session: Session, cluster: Cluster) -> None:
    """The cluster's row, its bindings, and every project's cap on it (``per_cluster``): a cluster registered
    later under the same name starts with none."""
    for project in session.scalars(select(Project).where(Project.per_cluster.is_not(None))):
        if cluster.name in (project.per_cluster or {}):
            project.per_cluster = {name: cap for name, cap in project.per_cluster.items() if name != cluster.name}
    session.delete(cluster)
    session.flush()
