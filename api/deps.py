"""Request dependencies: the service, a database session, and who is calling.

Those that do no I/O are ``async def``: FastAPI runs a plain ``def`` dependency in its thread pool, a hand-off
that costs more than most of them do (profiled under bench/api_load.py: hand-offs were a quarter of a cheap
request's CPU). What touches the database runs in a thread, as before.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime
from typing import Annotated

import anyio
from fastapi import Depends, Header, Request, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from orchestrator.auth import Principal, hash_secret, secrets_equal
from orchestrator.control_plane import ControlPlane
from orchestrator.db.models import ApiKey, Role, utcnow
from orchestrator.errors import Forbidden, Unauthorized
from orchestrator.repositories import projects as projects_repo
from orchestrator.use_cases.projects import note_key_used

bearer_scheme = HTTPBearer(auto_error=False)  # None when no bearer credentials come (the routes say 401 themselves)


async def get_control_plane(request: Request) -> ControlPlane:
    return request.app.state.service


ControlPlaneDep = Annotated[ControlPlane, Depends(get_control_plane)]


async def get_session(service: ControlPlaneDep) -> AsyncIterator[Session]:
    # Routers commit what they change; anything uncommitted is rolled back here. Routes that stream
    # or wait on Ray use service.sessions() briefly instead (see current_principal).
    session = service.sessions()  # no connection yet: the route's first query checks one out
    try:
        yield session
    finally:
        if session.in_transaction():  # a rollback and a return to the pool: I/O, so in a thread
            with anyio.CancelScope(shield=True):  # a cancelled request still gives its connection back
                await run_in_threadpool(session.close)
        else:
            session.close()


SessionDep = Annotated[Session, Depends(get_session)]
BearerDep = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)]


async def current_principal(credentials: BearerDep, service: ControlPlaneDep) -> Principal:
    """Who the bearer key is; 401 if nobody. On the event loop when no database is needed (an admin token, a
    key used in the last few seconds), in a thread when it is."""
    if credentials is None:
        raise Unauthorized("missing 'Authorization: Bearer <key>' header")
    secret = credentials.credentials
    key_hash = hash_secret(secret)
    known = _known_principal(service, secret, key_hash)
    if known is not None:
        return known
    return await run_in_threadpool(_stored_principal, service, key_hash)


def principal_for_secret(service: ControlPlane, secret: str) -> Principal:
    """Who a presented key is (the dashboard's sign-in form, the metrics scrape); 401 if nobody."""
    key_hash = hash_secret(secret)
    return _known_principal(service, secret, key_hash) or _stored_principal(service, key_hash)


def _known_principal(service: ControlPlane, secret: str, key_hash: str) -> Principal | None:
    """Who a key is without asking the database, if that can be told: None means look it up."""
    # The environment's tokens (several while one is rotated), each compared in constant time.
    if sum(secrets_equal(secret, token) for token in service.settings.admin_tokens):
        return Principal(Role.ADMIN, project_id=None, cluster_wide=True)
    # Valid keys seen in the last few seconds (orchestrator/key_cache.py): never an unknown one.
    return service.api_keys.get(key_hash, utcnow())


def _stored_principal(service: ControlPlane, key_hash: str) -> Principal:
    keys = service.api_keys
    generation = keys.generation  # read before the lookup: a revoke meanwhile keeps its answer out
    # Its own short session: on SQLite every transaction holds the write lock (see db/engine.py), so
    # nothing may keep one open for the length of a request, let alone a streamed response.
    with service.sessions() as session:
        key = projects_repo.find_api_key_by_hash(session, key_hash)
        principal, last_used_at = _key_principal(session, key)
        keys.put(key_hash, principal, key.expires_at, last_used_at, generation)
        return principal


def principal_for_key_id(service: ControlPlane, key_id: str) -> Principal:
    """Who the stored key ``key_id`` is now (the dashboard's session names its key by id): 401 once it is
    revoked or expired, the same checks as a presented key's."""
    with service.sessions() as session:
        return _key_principal(session, projects_repo.get_api_key(session, key_id))[0]


def _key_principal(session: Session, key: ApiKey | None) -> tuple[Principal, datetime | None]:
    """Who ``key`` is (401 if nobody, or expired), and when its use was last recorded, now included."""
    now = utcnow()
    if key is None:
        raise Unauthorized("unknown API key (it may have been revoked)")
    if key.expires_at is not None and key.expires_at <= now:
        raise Unauthorized(f"this API key expired at {key.expires_at.isoformat()}")
    principal = Principal(key.role, project_id=key.project_id, key_id=key.id, cluster_wide=key.cluster_wide)
    if note_key_used(session, key, now):  # at most once a minute per key
        session.commit()
        return principal, now
    return principal, key.last_used_at


CurrentKey = Annotated[Principal, Depends(current_principal)]


async def writer(principal: CurrentKey) -> Principal:
    if not principal.can_write:
        raise Forbidden(f"a {principal.role} key is read-only")
    return principal


async def admin(principal: CurrentKey) -> Principal:
    if not principal.is_admin:
        raise Forbidden("this needs an admin key")
    return principal


async def cluster_admin(principal: CurrentKey) -> Principal:
    if not principal.is_cluster_admin:
        raise Forbidden(
            "this needs a cluster-wide admin key (ORCHESTRATOR_ADMIN_TOKEN); a project's "
            "admin key acts in its own project only",
        )
    return principal


WriterKey = Annotated[Principal, Depends(writer)]
AdminKey = Annotated[Principal, Depends(admin)]
ClusterAdminKey = Annotated[Principal, Depends(cluster_admin)]


# An Idempotency-Key on a create (POST /v1/jobs, /v1/sweeps, /v1/deployments): orchestrator.use_cases.idempotency.
IdempotencyKey = Annotated[
    str | None,
    Header(max_length=128, description="Retries of the request with this key answer the first one's object (200)."),
]


def answer_created(response: Response, created: bool) -> None:
    """A create is 201; the replay of an Idempotency-Key is 200 with ``Idempotent-Replayed: true``."""
    if not created:
        response.status_code = 200
        response.headers["Idempotent-Replayed"] = "true"
