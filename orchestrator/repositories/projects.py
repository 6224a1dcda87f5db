from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestrator.auth import generate_secret, hash_secret
from orchestrator.db.models import ApiKey, Project, Role

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


def ensure_default_project(session: Session) -> Project:
    return get_project_by_name(session, DEFAULT_PROJECT) or create_project(session, DEFAULT_PROJECT)


def create_api_key(
    session: Session, project_id: str, role: Role, name: str = "", cluster_wide: bool = False
) -> tuple[ApiKey, str]:
    """Returns the row and the plaintext key, which is never stored and never shown again."""
    secret = generate_secret()
    key = ApiKey(
        project_id=project_id, role=role, name=name, key_hash=hash_secret(secret), prefix=secret[:10],
        cluster_wide=cluster_wide,
    )
    session.add(key)
    session.flush()
    return key, secret


def find_api_key(session: Session, secret: str) -> ApiKey | None:
    return session.scalars(select(ApiKey).where(ApiKey.key_hash == hash_secret(secret))).one_or_none()


def any_cluster_admin_key(session: Session) -> bool:
    query = select(ApiKey.id).where(ApiKey.role == Role.ADMIN, ApiKey.cluster_wide.is_(True)).limit(1)
    return session.scalars(query).first() is not None
