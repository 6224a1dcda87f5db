"""Request dependencies: the service, a database session, and who is calling."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from orchestrator.auth import Principal, secrets_equal
from orchestrator.control_plane import ControlPlane
from orchestrator.db.models import ApiKey, Role, utcnow
from orchestrator.errors import Forbidden, NotFound, Unauthorized
from orchestrator.repositories import projects as projects_repo

_bearer = HTTPBearer(auto_error=False)


def get_control_plane(request: Request) -> ControlPlane:
    return request.app.state.service


ControlPlaneDep = Annotated[ControlPlane, Depends(get_control_plane)]


def get_session(service: ControlPlaneDep) -> Iterator[Session]:
    # Routers commit what they change; anything uncommitted is rolled back here. Routes that stream
    # or wait on Ray use service.sessions() briefly instead (see current_principal).
    with service.sessions() as session:
        yield session


SessionDep = Annotated[Session, Depends(get_session)]
BearerDep = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


def current_principal(credentials: BearerDep, service: ControlPlaneDep) -> Principal:
    if credentials is None:
        raise Unauthorized("missing 'Authorization: Bearer <key>' header")
    return principal_for_secret(service, credentials.credentials)


def principal_for_secret(service: ControlPlane, secret: str) -> Principal:
    """Who a presented key is (the REST API's bearer token, the dashboard's sign-in form); 401 if nobody."""
    # The environment's tokens (several while one is rotated), each compared in constant time.
    if sum(secrets_equal(secret, token) for token in service.settings.admin_tokens):
        return Principal(Role.ADMIN, project_id=None, cluster_wide=True)
    # Its own short session: on SQLite every transaction holds the write lock (see db/engine.py), so
    # nothing may keep one open for the length of a request, let alone a streamed response.
    with service.sessions() as session:
        return _key_principal(session, projects_repo.find_api_key(session, secret))


def principal_for_key_id(service: ControlPlane, key_id: str) -> Principal:
    """Who the stored key ``key_id`` is now (the dashboard's session names its key by id): 401 once it is
    revoked or expired, the same checks as a presented key's."""
    with service.sessions() as session:
        return _key_principal(session, projects_repo.get_api_key(session, key_id))


def _key_principal(session: Session, key: ApiKey | None) -> Principal:
    now = utcnow()
    if key is None:
        raise Unauthorized("unknown API key (it may have been revoked)")
    if key.expires_at is not None and key.expires_at <= now:
        raise Unauthorized(f"this API key expired at {key.expires_at.isoformat()}")
    principal = Principal(key.role, project_id=key.project_id, key_id=key.id, cluster_wide=key.cluster_wide)
    if projects_repo.record_key_use(session, key, now):  # at most once a minute per key
        session.commit()
    return principal


CurrentKey = Annotated[Principal, Depends(current_principal)]


def writer(principal: CurrentKey) -> Principal:
    if not principal.can_write:
        raise Forbidden(f"a {principal.role} key is read-only")
    return principal


def admin(principal: CurrentKey) -> Principal:
    if not principal.is_admin:
        raise Forbidden("this needs an admin key")
    return principal


def cluster_admin(principal: CurrentKey) -> Principal:
    if not principal.is_cluster_admin:
        raise Forbidden(
            "this needs a cluster-wide admin key (ORCHESTRATOR_ADMIN_TOKEN); a project's "
            "admin key acts in its own project only",
        )
    return principal


WriterKey = Annotated[Principal, Depends(writer)]
AdminKey = Annotated[Principal, Depends(admin)]
ClusterAdminKey = Annotated[Principal, Depends(cluster_admin)]


def target_project(session, principal: Principal, project_id: str | None) -> str:
    """Keys submit into their own project; cluster-wide admins into ?project_id= or the default project."""
    if project_id is None:
        return principal.project_id or projects_repo.ensure_default_project(session).id
    return visible_project(session, principal, project_id)


def visible_project(session, principal: Principal, project_id: str) -> str:
    """``project_id`` if the caller may act in it; another project is simply not found (404)."""
    scope = principal.project_scope()
    if (scope is not None and project_id != scope) or projects_repo.get_project(session, project_id) is None:
        raise NotFound(f"no project {project_id}")
    return project_id
