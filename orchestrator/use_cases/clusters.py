"""The Ray clusters behind the control plane and which projects may use them (docs/clusters.md): the writes of
``/v1/clusters`` and ``PUT /v1/projects/{id}/clusters``, each with every one of its checks, and the views the API
answers with. Takes a session; never commits (the caller does, then refreshes the control plane's backends).

A Ray cluster is one trust domain, so the checks here keep a dedicated cluster to one project: binding a second
project to it, or making a cluster dedicated while two are bound, is a Conflict. The rows a check reads are locked
first (on PostgreSQL; SQLite runs one write at a time), so two concurrent writes cannot both pass it.
"""

from __future__ import annotations

from pydantic import ValidationError
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from orchestrator.backend.registry import token_ref_problem
from orchestrator.db.models import Cluster, Project, Tenancy
from orchestrator.errors import Conflict, Invalid, NotFound
from orchestrator.repositories import clusters as clusters_repo
from orchestrator.repositories import projects as projects_repo
from orchestrator_contract.rest import (
    ClusterCreate,
    ClusterOut,
    ClusterPatch,
    ProjectClusterOut,
    ProjectClusters,
    ProjectClustersOut,
)
from orchestrator_contract.rest.clusters import trust_of

BIND_HINT = "PUT /v1/projects/{id}/clusters"


# --- the writes ---------------------------------------------------------------------------------------------------


def create_cluster(session: Session, body: ClusterCreate, token_dir: str) -> Cluster:
    """Register a cluster. A taken name, or an address another cluster has (one Ray cluster under two names could
    be dedicated under one and shared under the other), is a Conflict; a ``token_ref`` outside what
    ``token_ref_problem`` allows (``token_dir``: ``Settings.cluster_token_dir``) is Invalid."""
    _token_ref_allowed(body.token_ref, token_dir)
    if clusters_repo.get_cluster(session, body.name) is not None:
        raise Conflict(f"a cluster named {body.name!r} already exists")
    _address_free(session, body.address)
    try:
        with session.begin_nested():
            cluster = clusters_repo.create_cluster(
                session,
                body.name,
                body.address,
                token_ref=body.token_ref,
                labels=body.labels,
                storage_root=body.storage_root,
                serve_url=body.serve_url,
                serve_port=body.serve_port,
                tenancy=Tenancy(body.tenancy),
            )
    except IntegrityError:  # registered meanwhile by another request
        raise Conflict(f"a cluster named {body.name!r} already exists") from None
    return cluster


def update_cluster(session: Session, name: str, body: ClusterPatch, token_dir: str) -> Cluster:
    """Change the fields ``body`` names. The default cluster's address and token come from the service's settings
    (set again on every start) and it serves every project with no binding, so it can't be dedicated; a cluster
    two or more projects are bound to can't become dedicated either."""
    cluster = _locked_cluster(session, name)
    given = body.model_fields_set
    if cluster.is_default:
        changed = []
        if "address" in given and not _same_address(body.address or "", cluster.address):
            changed.append("address")
        if "token_ref" in given and body.token_ref != cluster.token_ref:
            changed.append("token_ref")
        if "serve_port" in given and body.serve_port is not None:
            changed.append("serve_port")
        if changed:
            raise Conflict(
                f"cluster {name!r} is the service's own (the default cluster): its {' and '.join(changed)} come from "
                "the service's settings (RAY_ADDRESS or the local cluster it starts, ORCHESTRATOR_SERVE_PORT) and are "
                "set again on every start; change them there"
            )
    if "token_ref" in given and not cluster.is_default:
        _token_ref_allowed(body.token_ref, token_dir)
    if "address" in given and body.address is not None:
        _address_free(session, body.address, but=cluster)
    if body.tenancy == Tenancy.DEDICATED and cluster.tenancy != Tenancy.DEDICATED:
        if cluster.is_default:
            raise Conflict(
                f"cluster {name!r} is the default cluster, which every project with no cluster binding uses: it can't "
                "be dedicated to one project; register a cluster of its own for that project and bind it there "
                f"({BIND_HINT})"
            )
        bound = _project_names(session, clusters_repo.projects_on(session, cluster.id))
        if len(bound) >= 2:
            raise Conflict(
                f"cluster {name!r} can't be made dedicated: {len(bound)} projects are bound to it "
                f"({', '.join(bound)}) and a dedicated cluster runs one project's code only; bind all but one of them "
                f"elsewhere first ({BIND_HINT})"
            )
    if "storage_root" in given and body.storage_root != cluster.storage_root:
        live = clusters_repo.live_work_on(session, name)
        if live:
            raise Conflict(
                f"cluster {name!r}'s storage_root can't change while {live} run{'s' if live != 1 else ''} or "
                f"deployment{'s' if live != 1 else ''} on it read and write their folders there: change it once they "
                "have ended (ended runs' folders stay where they are)"
            )
    for field in ("address", "token_ref", "labels", "storage_root", "serve_url", "serve_port"):
        if field in given:
            setattr(cluster, field, getattr(body, field))
    if "tenancy" in given and body.tenancy is not None:
        cluster.tenancy = Tenancy(body.tenancy)
    session.flush()
    return cluster


def delete_cluster(session: Session, name: str) -> None:
    """Forget a cluster (Ray itself is left as it is). Not the default cluster, not while a job, sweep or
    deployment is still on it, and not while it is the only cluster of a project (whose runs would move to the
    default cluster, which that project's binding kept them off)."""
    cluster = _locked_cluster(session, name)
    if cluster.is_default:
        raise Conflict(
            f"cluster {name!r} is the default cluster (the service's own, which every project with no cluster binding "
            "uses): it can't be deleted"
        )
    live = clusters_repo.live_work_on(session, name)
    if live:
        raise Conflict(
            f"cluster {name!r} still has {live} run{'s' if live != 1 else ''} or deployment{'s' if live != 1 else ''} "
            "on it (jobs and sweeps not yet ended, deployments not deleted): cancel or delete them, or let them end, "
            "then delete the cluster"
        )
    bound = clusters_repo.bindings(session, clusters_repo.projects_on(session, cluster.id))
    only_here = _project_names(session, [p for p, names in bound.items() if names == {name}])
    if only_here:
        raise Conflict(
            f"cluster {name!r} is the only cluster of project{'s' if len(only_here) > 1 else ''} "
            f"{', '.join(only_here)}: deleting it would move their runs to the default cluster; bind them to another "
            f"cluster first ({BIND_HINT})"
        )
    clusters_repo.delete_cluster(session, cluster)


def set_project_clusters(session: Session, project_id: str, body: ProjectClusters) -> Project:
    """Replace the clusters a project may use. Every name must be a registered cluster (else Invalid, naming the
    registered ones), and a dedicated cluster another project is bound to is a Conflict naming that project."""
    project = projects_repo.get_project(session, project_id)
    if project is None:
        raise NotFound(f"no project {project_id}")
    found = {name: clusters_repo.get_cluster(session, name) for name in body.clusters}
    unknown = [name for name, cluster in found.items() if cluster is None]
    if unknown:
        registered = [c.name for c in clusters_repo.list_clusters(session)]
        raise Invalid(
            f"no cluster named {', '.join(unknown)}; the registered clusters are: "
            f"{', '.join(registered) if registered else 'none'} (POST /v1/clusters registers one)",
            loc=("clusters",),
        )
    clusters = [found[name] for name in body.clusters]
    for cluster in sorted(clusters, key=lambda c: c.name):  # one order for every writer: no deadlock
        _lock(session, cluster)
    for cluster in clusters:
        if cluster.tenancy != Tenancy.DEDICATED:
            continue
        others = _project_names(session, [p for p in clusters_repo.projects_on(session, cluster.id) if p != project_id])
        if others:
            raise Conflict(
                f"cluster {cluster.name!r} is dedicated to project {others[0]}: only that project's code runs on it "
                f"(a Ray cluster is one trust domain); unbind it there, make it shared (PATCH /v1/clusters/"
                f"{cluster.name}) if those projects may trust each other, or register another cluster"
            )
    clusters_repo.set_bindings(session, project_id, clusters)
    return project


def _token_ref_allowed(token_ref: str | None, token_dir: str) -> None:
    problem = token_ref_problem(token_ref, token_dir)
    if problem:
        raise Invalid(problem, loc=("token_ref",))


# --- the views ----------------------------------------------------------------------------------------------------


def cluster_views(session: Session, clusters: list[Cluster]) -> list[ClusterOut]:
    """The clusters as cluster-wide admins see them: with the names of the projects bound to each, and their
    ``trust`` sentence."""
    names = {p.id: p.name for p in projects_repo.list_projects(session)}
    on: dict[str, list[str]] = {}
    for project_id, cluster_names in clusters_repo.bindings(session).items():
        for cluster_name in cluster_names:
            on.setdefault(cluster_name, []).append(names.get(project_id, project_id))
    views = []
    for cluster in clusters:
        projects = sorted(on.get(cluster.name, []))
        tenancy = Tenancy(cluster.tenancy).value
        views.append(
            ClusterOut(
                name=cluster.name,
                address=cluster.address,
                token_ref=cluster.token_ref,
                labels={str(k): str(v) for k, v in (cluster.labels or {}).items()},
                storage_root=cluster.storage_root,
                serve_url=cluster.serve_url,
                serve_port=cluster.serve_port,
                tenancy=tenancy,
                is_default=cluster.is_default,
                projects=projects,
                trust=trust_of(tenancy, cluster.is_default, projects),
                created_at=cluster.created_at,
            )
        )
    return views


def cluster_view(session: Session, cluster: Cluster) -> ClusterOut:
    return cluster_views(session, [cluster])[0]


def project_clusters_view(session: Session, project_id: str) -> ProjectClustersOut:
    """Where a project's runs may be placed, as its own keys may see it: no other project is named (they are
    counted), and no cluster's address, token or storage is shown."""
    project = projects_repo.get_project(session, project_id)
    if project is None:
        raise NotFound(f"no project {project_id}")
    unbound = not clusters_repo.bound_cluster_ids(session, project_id)
    views = []
    for cluster in clusters_repo.usable_clusters(session, project_id):
        others = [p for p in clusters_repo.projects_on(session, cluster.id) if p != project_id]
        tenancy = Tenancy(cluster.tenancy).value
        views.append(
            ProjectClusterOut(
                name=cluster.name,
                labels={str(k): str(v) for k, v in (cluster.labels or {}).items()},
                tenancy=tenancy,
                is_default=cluster.is_default,
                trust=trust_of(tenancy, cluster.is_default, [project.name], others=len(others)),
            )
        )
    return ProjectClustersOut(project_id=project_id, clusters=views, default=unbound)


# --- helpers ------------------------------------------------------------------------------------------------------


def _lock(session: Session, cluster: Cluster) -> None:
    """Hold the cluster's row until the transaction ends (SELECT ... FOR UPDATE; SQLite runs one write at a time)."""
    session.refresh(cluster, with_for_update=True)


def _locked_cluster(session: Session, name: str) -> Cluster:
    cluster = clusters_repo.get_cluster(session, name)
    if cluster is None:
        raise NotFound(f"no cluster named {name!r}")
    _lock(session, cluster)
    return cluster


def _same_address(a: str, b: str) -> bool:
    return a.rstrip("/").lower() == b.rstrip("/").lower()


def _address_free(session: Session, address: str, but: Cluster | None = None) -> None:
    for other in clusters_repo.list_clusters(session):
        if other is not but and _same_address(other.address, address):
            raise Conflict(
                f"cluster {other.name!r} already has the address {other.address}: one Ray cluster is registered once "
                "(its tenancy says who may share it)"
            )


def _project_names(session: Session, project_ids: list[str]) -> list[str]:
    names = []
    for project_id in project_ids:
        project = projects_repo.get_project(session, project_id)
        names.append(project.name if project is not None else project_id)
    return sorted(names)


def register_from_settings(session: Session, entries: list[dict], token_dir: str) -> list[str]:
    """``ORCHESTRATOR_CLUSTERS`` (how the Helm chart registers the clusters it creates): each entry registered, or
    brought in line if it exists, with every check the API makes. Returns what was refused, one line each (the
    service starts anyway: the other clusters work)."""
    refused = []
    for entry in entries:
        try:
            body = ClusterCreate.model_validate(entry)
            if clusters_repo.get_cluster(session, body.name) is None:
                create_cluster(session, body, token_dir)
            else:
                update_cluster(session, body.name, ClusterPatch(**body.model_dump(exclude={"name"})), token_dir)
        except (ValidationError, Conflict, Invalid) as exc:
            refused.append(f"ORCHESTRATOR_CLUSTERS entry {entry.get('name', entry)!r}: {exc}")
    return refused
