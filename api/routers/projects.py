from __future__ import annotations

from fastapi import APIRouter, status
from sqlalchemy.exc import IntegrityError

from api.deps import AdminKey, ClusterAdminKey, CurrentKey, SessionDep, visible_project
from orchestrator.db.models import utcnow
from orchestrator.errors import Conflict, NotFound
from orchestrator.repositories import projects as projects_repo
from workers.contract.rest import KeyCreate, KeyCreated, KeyOut, ProjectCreate, ProjectOut, ProjectPatch

router = APIRouter(prefix="/v1/projects", tags=["projects"])


@router.post("", status_code=status.HTTP_201_CREATED)
def create_project(body: ProjectCreate, session: SessionDep, _: ClusterAdminKey) -> ProjectOut:
    try:
        project = projects_repo.create_project(session, body.name)
        project.max_priority = body.max_priority
        session.commit()
    except IntegrityError:
        session.rollback()
        raise Conflict(f"a project named {body.name!r} already exists") from None
    return ProjectOut.model_validate(project)


@router.get("")
def list_projects(session: SessionDep, principal: CurrentKey) -> list[ProjectOut]:
    return [ProjectOut.model_validate(p) for p in projects_repo.list_projects(session, principal.project_scope())]


@router.get("/{project_id}")
def get_project(project_id: str, session: SessionDep, principal: CurrentKey) -> ProjectOut:
    """The project and its limits (``max_priority``); another project's is 404."""
    visible_project(session, principal, project_id)
    return ProjectOut.model_validate(projects_repo.get_project(session, project_id))


@router.patch("/{project_id}")
def update_project(project_id: str, body: ProjectPatch, session: SessionDep, _: ClusterAdminKey) -> ProjectOut:
    """Cluster-wide admins: set the project's limits (``max_priority``: null lifts the cap). Jobs already
    queued keep their priority; new ones are held to the cap."""
    project = projects_repo.get_project(session, project_id)
    if project is None:
        raise NotFound(f"no project {project_id}")
    if "max_priority" in body.model_fields_set:
        project.max_priority = body.max_priority
    session.commit()
    return ProjectOut.model_validate(project)


@router.post("/{project_id}/keys", status_code=status.HTTP_201_CREATED)
def create_key(project_id: str, body: KeyCreate, session: SessionDep, principal: AdminKey) -> KeyCreated:
    """A key for this project, acting in it only (a project's admin key makes keys for its own project)."""
    visible_project(session, principal, project_id)
    key, secret = projects_repo.create_api_key(
        session, project_id, body.role, body.name, expires_at=body.expiry(utcnow())
    )
    session.commit()
    return KeyCreated(**KeyOut.model_validate(key).model_dump(), key=secret)


@router.get("/{project_id}/keys")
def list_keys(project_id: str, session: SessionDep, principal: AdminKey) -> list[KeyOut]:
    """The project's keys (never a secret or its hash): for the project's admins and cluster-wide admins."""
    visible_project(session, principal, project_id)
    keys = projects_repo.list_api_keys(session, project_id, cluster_wide=principal.is_cluster_admin)
    return [KeyOut.model_validate(key) for key in keys]


@router.delete("/{project_id}/keys/{key_id}", status_code=status.HTTP_204_NO_CONTENT)
def revoke_key(project_id: str, key_id: str, session: SessionDep, principal: AdminKey) -> None:
    """Revoke a key: it answers 401 from the next request on. A cluster-wide key only by a cluster-wide admin."""
    visible_project(session, principal, project_id)
    if not projects_repo.delete_api_key(session, project_id, key_id, cluster_wide=principal.is_cluster_admin):
        raise NotFound(f"no key {key_id} in project {project_id}")
    session.commit()
