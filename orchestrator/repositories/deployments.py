from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestrator.db.models import Deployment, DeploymentEvent, DeploymentState, DeploymentVersion
from orchestrator.repositories.paging import fetch_page
from orchestrator.states.deployments import LIVE


def create_deployment(
    session: Session,
    project_id: str,
    name: str,
    workload: str,
    route_prefix: str,
    state: DeploymentState = DeploymentState.DEPLOYING,
) -> Deployment:
    """A new row, DEPLOYING or QUEUED (``orchestrator.states.deployments``: its creation record follows)."""
    deployment = Deployment(
        project_id=project_id,
        name=name,
        workload=workload,
        route_prefix=route_prefix,
        state=state,
        reason="created",
        version=0,
    )
    session.add(deployment)
    session.flush()
    return deployment


def add_version(
    session: Session,
    deployment: Deployment,
    *,
    checkpoint_id: int | None,
    checkpoint_path: str,
    job_id: str | None,
    checkpoint: dict[str, Any],
    config: dict[str, Any],
    source: dict[str, Any],
    settings: dict[str, Any],
    note: str = "",
) -> DeploymentVersion:
    """Append the next version and make it the deployment's target (the caller moves the state)."""
    version = DeploymentVersion(
        deployment_id=deployment.id,
        version=deployment.version + 1,
        checkpoint_id=checkpoint_id,
        checkpoint_path=checkpoint_path,
        job_id=job_id,
        checkpoint=checkpoint,
        config=config,
        source=source,
        settings=settings,
        note=note,
    )
    deployment.versions.append(version)
    deployment.version = version.version
    session.flush()
    return version


def find_by_idempotency_key(session: Session, project_id: str, key: str) -> Deployment | None:
    return session.scalars(
        select(Deployment).where(Deployment.project_id == project_id, Deployment.idempotency_key == key)
    ).one_or_none()


def find_live(session: Session, name: str) -> Deployment | None:
    """The live deployment with this name, in any project (names are cluster-wide on Serve)."""
    return session.scalars(
        select(Deployment).where(Deployment.name == name, Deployment.state != DeploymentState.DELETED)
    ).one_or_none()


def route_taken(session: Session, route_prefix: str) -> Deployment | None:
    return session.scalars(
        select(Deployment).where(Deployment.route_prefix == route_prefix, Deployment.state != DeploymentState.DELETED)
    ).one_or_none()


def get_by_name(session: Session, name: str, project_scope: str | None) -> Deployment | None:
    """The live deployment of that name, else the most recently deleted one; another project's is None."""
    query = (
        select(Deployment)
        .where(Deployment.name == name)
        .order_by((Deployment.state == DeploymentState.DELETED), Deployment.created_at.desc())
        .limit(1)
    )
    if project_scope is not None:
        query = query.where(Deployment.project_id == project_scope)
    return session.scalars(query).first()


def list_deployments(
    session: Session, project_scope: str | None, states: list[DeploymentState] | None, cursor: str | None, limit: int
) -> tuple[list[Deployment], str | None]:
    """Newest first; without ``states``, every deployment but the deleted ones. A page and the next
    page's cursor (None on the last)."""
    query = select(Deployment)
    if project_scope is not None:
        query = query.where(Deployment.project_id == project_scope)
    query = query.where(Deployment.state.in_(states or sorted(LIVE)))
    return fetch_page(session, query, (Deployment.created_at, Deployment.id), cursor, limit, descending=True)


def queued_deployments(session: Session) -> list[Deployment]:
    """The deployments whose newest version waits to be admitted (QUEUED), oldest first."""
    return list(
        session.scalars(
            select(Deployment).where(Deployment.state == DeploymentState.QUEUED).order_by(Deployment.created_at)
        )
    )


def live_deployments(session: Session) -> list[Deployment]:
    return list(
        session.scalars(
            select(Deployment).where(Deployment.state != DeploymentState.DELETED).order_by(Deployment.created_at)
        )
    )


def any_deployment(session: Session) -> bool:
    return session.scalars(select(Deployment.id).limit(1)).first() is not None


def list_events(session: Session, deployment_id: str) -> list[DeploymentEvent]:
    return list(
        session.scalars(
            select(DeploymentEvent).where(DeploymentEvent.deployment_id == deployment_id).order_by(DeploymentEvent.id)
        )
    )


def page_events(
    session: Session, deployment_id: str, cursor: str | None, limit: int
) -> tuple[list[DeploymentEvent], str | None]:
    query = select(DeploymentEvent).where(DeploymentEvent.deployment_id == deployment_id)
    return fetch_page(session, query, (DeploymentEvent.id,), cursor, limit)


def referenced_checkpoint_paths(session: Session) -> set[str]:
    """Checkpoint folders live deployments may load (any of their versions: a rollback needs the old
    ones): storage clean-up must keep them."""
    rows = session.execute(
        select(DeploymentVersion.checkpoint_path)
        .join(Deployment, Deployment.id == DeploymentVersion.deployment_id)
        .where(Deployment.state != DeploymentState.DELETED)
    )
    return {path for (path,) in rows}


def referenced_checkpoint_jobs(session: Session) -> set[str]:
    """The jobs whose checkpoints live deployments reference (see ``referenced_checkpoint_paths``)."""
    rows = session.execute(
        select(DeploymentVersion.job_id)
        .join(Deployment, Deployment.id == DeploymentVersion.deployment_id)
        .where(Deployment.state != DeploymentState.DELETED, DeploymentVersion.job_id.is_not(None))
        .distinct()
    )
    return {job_id for (job_id,) in rows}
