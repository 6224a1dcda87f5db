"""Code packages, always scoped by project. Functions take a session and never commit."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestrator.db.models import CodePackage, Job, Sweep, utcnow
from orchestrator.repositories.paging import fetch_page

ID_PREFIX = "sha256:"


def api_id(sha256: str) -> str:
    return f"{ID_PREFIX}{sha256}"


def sha256_of(package_id: str) -> str | None:
    """The hex digest of an API id ``sha256:<hex>``; None for anything else."""
    if not package_id.startswith(ID_PREFIX):
        return None
    digest = package_id[len(ID_PREFIX) :]
    return digest if len(digest) == 64 and all(c in "0123456789abcdef" for c in digest) else None


def get_package(session: Session, project_id: str, package_id: str) -> CodePackage | None:
    """The project's package with API id ``package_id``; another project's is simply not found."""
    digest = sha256_of(package_id)
    if digest is None:
        return None
    return session.scalar(select(CodePackage).where(CodePackage.project_id == project_id, CodePackage.sha256 == digest))


def add_package(session: Session, package: CodePackage) -> CodePackage:
    session.add(package)
    session.flush()
    return package


def list_packages(
    session: Session, project_id: str, cursor: str | None, limit: int
) -> tuple[list[CodePackage], str | None]:
    """Newest first: a page and the next page's cursor."""
    query = select(CodePackage).where(CodePackage.project_id == project_id)
    return fetch_page(session, query, (CodePackage.created_at, CodePackage.id), cursor, limit, descending=True)


def mark_used(session: Session, package: CodePackage, now: datetime | None = None) -> None:
    package.last_used_at = now or utcnow()


def referenced(session: Session, project_ids: Iterable[str]) -> set[tuple[str, str]]:
    """(project id, sha256) of every package of these projects that a job or sweep names (its code.id), in
    any state: a finished run's checkpoints may still be resumed from or served, which needs its code."""
    names = set()
    for spec_of, model in ((_job_code, Job), (_sweep_code, Sweep)):
        for project_id, spec in session.execute(
            select(model.project_id, model.spec).where(model.project_id.in_(set(project_ids)))
        ):
            digest = sha256_of(spec_of(spec) or "")
            if digest:
                names.add((project_id, digest))
    return names


def unused_since(session: Session, before: datetime) -> list[CodePackage]:
    return list(session.scalars(select(CodePackage).where(CodePackage.last_used_at < before)))


def delete_package(session: Session, package: CodePackage) -> None:
    session.delete(package)
    session.flush()


def _job_code(spec: dict) -> str | None:
    return ((spec or {}).get("code") or {}).get("id")


def _sweep_code(spec: dict) -> str | None:
    return _job_code((spec or {}).get("base") or {})
