"""Request dependencies: the service, a database session, and who is calling."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from orchestrator.auth import Principal, secrets_equal
from orchestrator.db.models import Role
from orchestrator.repositories import projects as projects_repo
from orchestrator.service import Service

_bearer = HTTPBearer(auto_error=False)


def get_service(request: Request) -> Service:
    return request.app.state.service


ServiceDep = Annotated[Service, Depends(get_service)]


def get_session(service: ServiceDep) -> Iterator[Session]:
    # Routers commit what they change; anything uncommitted is rolled back here. Routes that stream
    # or wait on Ray use service.sessions() briefly instead (see current_principal).
    with service.sessions() as session:
        yield session


SessionDep = Annotated[Session, Depends(get_session)]
BearerDep = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


def _unauthorized(message: str) -> HTTPException:
    return HTTPException(status.HTTP_401_UNAUTHORIZED, message, headers={"WWW-Authenticate": "Bearer"})


def current_principal(credentials: BearerDep, service: ServiceDep) -> Principal:
    if credentials is None:
        raise _unauthorized("missing 'Authorization: Bearer <key>' header")
    secret = credentials.credentials
    admin_token = service.settings.admin_token
    if admin_token and secrets_equal(secret, admin_token):
        return Principal(Role.ADMIN, project_id=None)
    # Its own short session: on SQLite every transaction holds the write lock (see db/engine.py), so
    # nothing may keep one open for the length of a request, let alone a streamed response.
    with service.sessions() as session:
        key = projects_repo.find_api_key(session, secret)
    if key is None:
        raise _unauthorized("unknown API key")
    return Principal(key.role, project_id=key.project_id, key_id=key.id)


CurrentKey = Annotated[Principal, Depends(current_principal)]


def writer(principal: CurrentKey) -> Principal:
    if not principal.can_write:
        raise HTTPException(status.HTTP_403_FORBIDDEN, f"a {principal.role} key is read-only")
    return principal


def admin(principal: CurrentKey) -> Principal:
    if not principal.is_admin:
        raise HTTPException(status.HTTP_403_FORBIDDEN, "this needs an admin key")
    return principal


WriterKey = Annotated[Principal, Depends(writer)]
AdminKey = Annotated[Principal, Depends(admin)]


def target_project(session, principal: Principal, project_id: str | None) -> str:
    """Members submit into their own project; admins into ?project_id= or their key's project."""
    if project_id is None:
        return principal.project_id or projects_repo.ensure_default_project(session).id
    if not principal.is_admin and project_id != principal.project_id:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no project {project_id}")
    if projects_repo.get_project(session, project_id) is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no project {project_id}")
    return project_id
