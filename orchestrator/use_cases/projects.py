"""Projects and their keys: which project a write acts in, and the writes of the projects API."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from orchestrator.auth import Principal
from orchestrator.db.models import ApiKey, Project, utcnow
from orchestrator.errors import Conflict, Invalid, NotFound
from orchestrator.repositories import clusters as clusters_repo
from orchestrator.repositories import projects as projects_repo
from orchestrator_contract.rest import KeyCreate, ProjectCreate, ProjectPatch, Quota


def target_project(session: Session, principal: Principal, project_id: str | None) -> str:
    """Keys submit into their own project; cluster-wide admins into ``project_id`` or the default project."""
    if project_id is None:
        return principal.project_id or projects_repo.ensure_default_project(session).id
    return visible_project(session, principal, project_id)


def visible_project(session: Session, principal: Principal, project_id: str) -> str:
    """``project_id`` if the caller may act in it; another project is simply not found (404)."""
    scope = principal.project_scope()
    if (scope is not None and project_id != scope) or projects_repo.get_project(session, project_id) is None:
        raise NotFound(f"no project {project_id}")
    return project_id


def create_project(session: Session, body: ProjectCreate) -> Project:
    """A new project (a tenant); a taken name is a Conflict."""
    try:
        with session.begin_nested():
            project = projects_repo.create_project(session, body.name)
            project.max_priority = body.max_priority
    except IntegrityError:
        raise Conflict(f"a project named {body.name!r} already exists") from None
    return project


def _project_or_404(session: Session, project_id: str) -> Project:
    project = projects_repo.get_project(session, project_id)
    if project is None:
        raise NotFound(f"no project {project_id}")
    return project


def update_project(session: Session, project_id: str, body: ProjectPatch) -> Project:
    """The project's limits that the body names (``max_priority``: null lifts the cap)."""
    project = _project_or_404(session, project_id)
    if "max_priority" in body.model_fields_set:
        project.max_priority = body.max_priority
    if "allow_non_preemptible" in body.model_fields_set:
        project.allow_non_preemptible = body.allow_non_preemptible
    return project


def set_quota(session: Session, project_id: str, body: Quota) -> Project:
    """Replace the project's quota and fair-share weight (a field left out goes back to its default)."""
    project = _project_or_404(session, project_id)
    registered = {c.name for c in clusters_repo.list_clusters(session)}
    unknown = sorted(set(body.per_cluster) - registered)
    if unknown:
        raise Invalid(
            f"no cluster named {', '.join(unknown)}; the registered clusters are: "
            f"{', '.join(sorted(registered)) or 'none'} (GET /v1/clusters)",
            loc=("per_cluster",),
        )
    for name, value in body.model_dump().items():
        setattr(project, name, value)
    return project


def create_api_key(session: Session, principal: Principal, project_id: str, body: KeyCreate) -> tuple[ApiKey, str]:
    """A key for a project the caller may act in, and its secret (shown once)."""
    visible_project(session, principal, project_id)
    return projects_repo.create_api_key(session, project_id, body.role, body.name, expires_at=body.expiry(utcnow()))


def revoke_api_key(session: Session, principal: Principal, project_id: str, key_id: str) -> None:
    """The key goes (401 from the next request on); a cluster-wide key only by a cluster-wide admin."""
    visible_project(session, principal, project_id)
    if not projects_repo.delete_api_key(session, project_id, key_id, cluster_wide=principal.is_cluster_admin):
        raise NotFound(f"no key {key_id} in project {project_id}")


def note_key_used(session: Session, key: ApiKey, now: datetime) -> bool:
    """Record that ``key`` acted now (at most once a minute per key); False when nothing was written."""
    return projects_repo.record_key_use(session, key, now)
