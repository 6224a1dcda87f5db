from __future__ import annotations

from fastapi import APIRouter, status

from api.deps import AdminKey, ClusterAdminKey, ControlPlaneDep, CurrentKey, SessionDep
from api.paging import Page
from orchestrator.repositories import projects as projects_repo
from orchestrator.use_cases import clusters, projects
from orchestrator.use_cases.projects import visible_project
from orchestrator_contract.rest import (
    KeyCreate,
    KeyCreated,
    KeyOut,
    Paged,
    ProjectClusters,
    ProjectClustersOut,
    ProjectCreate,
    ProjectOut,
    ProjectPatch,
    Quota,
)

router = APIRouter(prefix="/v1/projects", tags=["projects"])


@router.post("", status_code=status.HTTP_201_CREATED, summary="Create a project")
def create_project(body: ProjectCreate, session: SessionDep, _: ClusterAdminKey) -> ProjectOut:
    """Cluster-wide admins: a new project (a tenant). Its keys act in it only; a taken name is 409."""
    project = projects.create_project(session, body)
    session.commit()
    return ProjectOut.model_validate(project)


@router.get("", summary="List projects")
def list_projects(session: SessionDep, principal: CurrentKey, page: Page) -> list[ProjectOut] | Paged[ProjectOut]:
    """Oldest first: every project for a cluster-wide admin, the key's own project for any other key;
    paged (X-Next-Cursor)."""
    scope = principal.project_scope()
    return page.answer(
        [
            ProjectOut.model_validate(p)
            for p in page.fetch(lambda c, n: projects_repo.page_projects(session, scope, c, n))
        ]
    )


@router.get("/{project_id}", summary="Get a project")
def get_project(project_id: str, session: SessionDep, principal: CurrentKey) -> ProjectOut:
    """The project and its limits (``max_priority``, ``quota``); another project's is 404."""
    visible_project(session, principal, project_id)
    return ProjectOut.model_validate(projects_repo.get_project(session, project_id))


@router.patch("/{project_id}", summary="Set a project's limits")
def update_project(project_id: str, body: ProjectPatch, session: SessionDep, _: ClusterAdminKey) -> ProjectOut:
    """Cluster-wide admins: set the project's limits (``max_priority``: null lifts the cap). Jobs already
    queued keep their priority; new ones are held to the cap."""
    project = projects.update_project(session, project_id, body)
    session.commit()
    return ProjectOut.model_validate(project)


@router.put("/{project_id}/quota", summary="Set a project's quota")
def set_quota(project_id: str, body: Quota, session: SessionDep, _: ClusterAdminKey) -> ProjectOut:
    """Cluster-wide admins: replace the project's quota and fair-share weight (a field left out goes back to its
    default: no limit, weight 1, borrowing on). Runs already admitted keep running; queued ones are admitted
    against the new quota from the next scheduler tick (docs/scheduling.md)."""
    project = projects.set_quota(session, project_id, body)
    session.commit()
    return ProjectOut.model_validate(project)


@router.put("/{project_id}/clusters", summary="Bind a project to Ray clusters")
def set_clusters(project_id: str, body: ProjectClusters, session: SessionDep, _: ClusterAdminKey) -> ProjectClustersOut:
    """Cluster-wide admins: replace the clusters the project's runs may be placed on (docs/clusters.md). An unknown
    cluster is 422 (naming the registered ones); a dedicated cluster another project is bound to is 409 (naming
    that project). Runs already placed stay where they are."""
    clusters.set_project_clusters(session, project_id, body)
    session.commit()
    return clusters.project_clusters_view(session, project_id)


@router.get("/{project_id}/clusters", summary="A project's Ray clusters")
def get_clusters(project_id: str, session: SessionDep, principal: CurrentKey) -> ProjectClustersOut:
    """The clusters the project's runs may be placed on: those it is bound to, or else the default cluster
    (``default: true``), each with whose code shares it (``trust``). Another project's is 404."""
    visible_project(session, principal, project_id)
    return clusters.project_clusters_view(session, project_id)


@router.post("/{project_id}/keys", status_code=status.HTTP_201_CREATED, summary="Create an API key")
def create_key(project_id: str, body: KeyCreate, session: SessionDep, principal: AdminKey) -> KeyCreated:
    """A key for this project, acting in it only (a project's admin key makes keys for its own project)."""
    key, secret = projects.create_api_key(session, principal, project_id, body)
    session.commit()
    return KeyCreated(**KeyOut.model_validate(key).model_dump(), key=secret)


@router.get("/{project_id}/keys", summary="List a project's API keys")
def list_keys(project_id: str, session: SessionDep, principal: AdminKey, page: Page) -> list[KeyOut] | Paged[KeyOut]:
    """The project's keys (never a secret or its hash): for the project's admins and cluster-wide admins.
    Oldest first; paged (X-Next-Cursor)."""
    visible_project(session, principal, project_id)
    cluster_wide = principal.is_cluster_admin
    keys = page.fetch(lambda c, n: projects_repo.page_api_keys(session, project_id, cluster_wide, c, n))
    return page.answer([KeyOut.model_validate(key) for key in keys])


@router.delete("/{project_id}/keys/{key_id}", status_code=status.HTTP_204_NO_CONTENT, summary="Revoke an API key")
def revoke_key(
    project_id: str, key_id: str, session: SessionDep, service: ControlPlaneDep, principal: AdminKey
) -> None:
    """Revoke a key: it answers 401 from the next request on (at another replica: within
    ORCHESTRATOR_API_KEY_CACHE_S). A cluster-wide key only by a cluster-wide admin."""
    projects.revoke_api_key(session, principal, project_id, key_id)
    session.commit()
    service.api_keys.forget(key_id)  # this process's memory of it, before the 204 is sent
