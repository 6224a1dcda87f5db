from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import delete, or_, select, update
from sqlalchemy.orm import Session

from orchestrator.auth import generate_secret, hash_secret
from orchestrator.db.models import ApiKey, Project, Role
from orchestrator.repositories.paging import fetch_page

DEFAULT_PROJECT = "default"


def create_project(session: Session, name: str) -> Project:
    project = Project(name=name)
    session.add(project)
    session.flush()
    return project


def get_project(session: Session, project_id: str) -> Project | None:
    return session.get(Project, project_id)


def get_project_by_name(session: Session, name: str) -> Project | None:
    return session.scalars(select(Project).where(Project.name == name)).one_or_none()


def list_projects(session: Session, project_id: str | None = None) -> list[Project]:
    query = select(Project).order_by(Project.created_at)
    if project_id is not None:
        query = query.where(Project.id == project_id)
    return list(session.scalars(query))


def page_projects(
    session: Session, project_id: str | None, cursor: str | None, limit: int
) -> tuple[list[Project], str | None]:
    """``list_projects``, a page at a time (oldest first): the page and the next page's cursor (None on the last)."""
    query = select(Project)
    if project_id is not None:
        query = query.where(Project.id == project_id)
    return fetch_page(session, query, (Project.created_at, Project.id), cursor, limit)


def ensure_default_project(session: Session) -> Project:
    return get_project_by_name(session, DEFAULT_PROJECT) or create_project(session, DEFAULT_PROJECT)


# How stale a key's last_used_at may get: a key is written at most this often, not on every request.
LAST_USED_RESOLUTION = timedelta(minutes=1)


def create_api_key(
    session: Session,
    project_id: str,
    role: Role,
    name: str = "",
    cluster_wide: bool = False,
    expires_at: datetime | None = None,
) -> tuple[ApiKey, str]:
    """Returns the row and the plaintext key, which is never stored and never shown again."""
    secret = generate_secret()
    key = ApiKey(
        project_id=project_id,
        role=role,
        name=name,
        key_hash=hash_secret(secret),
        prefix=secret[:10],
        cluster_wide=cluster_wide,
        expires_at=expires_at,
    )
    session.add(key)
    session.flush()
    return key, secret


def get_api_key(session: Session, key_id: str) -> ApiKey | None:
    return session.get(ApiKey, key_id)


def find_api_key_by_hash(session: Session, key_hash: str) -> ApiKey | None:
    """The key whose secret hashes to ``key_hash`` (``orchestrator.auth.hash_secret``), if any."""
    return session.scalars(select(ApiKey).where(ApiKey.key_hash == key_hash)).one_or_none()


def list_api_keys(session: Session, project_id: str, cluster_wide: bool) -> list[ApiKey]:
    """A project's keys, oldest first; the cluster-wide ones only when ``cluster_wide`` (for their admins)."""
    query = select(ApiKey).where(ApiKey.project_id == project_id).order_by(ApiKey.created_at, ApiKey.id)
    if not cluster_wide:
        query = query.where(ApiKey.cluster_wide.is_(False))
    return list(session.scalars(query))


def page_api_keys(
    session: Session, project_id: str, cluster_wide: bool, cursor: str | None, limit: int
) -> tuple[list[ApiKey], str | None]:
    """``list_api_keys``, a page at a time: the page and the next page's cursor (None on the last)."""
    query = select(ApiKey).where(ApiKey.project_id == project_id)
    if not cluster_wide:
        query = query.where(ApiKey.cluster_wide.is_(False))
    return fetch_page(session, query, (ApiKey.created_at, ApiKey.id), cursor, limit)


def delete_api_key(session: Session, project_id: str, key_id: str, cluster_wide: bool) -> bool:
    """Revoke: the row goes, so the key is unknown from the next request on. False if there was none."""
    query = delete(ApiKey).where(ApiKey.project_id == project_id, ApiKey.id == key_id)
    if not cluster_wide:
        query = query.where(ApiKey.cluster_wide.is_(False))
    return session.execute(query).rowcount > 0


def record_key_use(session: Session, key: ApiKey, now: datetime) -> bool:
    """Set ``last_used_at`` if it is older than LAST_USED_RESOLUTION; False (and no write) otherwise.

    The condition is repeated in the UPDATE, so concurrent requests of one key write it once.
    """
    stale = now - LAST_USED_RESOLUTION
    if key.last_used_at is not None and key.last_used_at > stale:
        return False
    query = (
        update(ApiKey)
        .where(ApiKey.id == key.id, or_(ApiKey.last_used_at.is_(None), ApiKey.last_used_at <= stale))
        .values(last_used_at=now)
    )
    return session.execute(query).rowcount > 0


def any_cluster_admin_key(session: Session) -> bool:
    query = select(ApiKey.id).where(ApiKey.role == Role.ADMIN, ApiKey.cluster_wide.is_(True)).limit(1)
    return session.scalars(query).first() is not None
