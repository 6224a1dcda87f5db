"""Deployments: a committed checkpoint served over HTTP on Ray Serve, updated and rolled back by version.

The routes only change the database (one transaction each, through ``orchestrator.use_cases.deployments``);
the serving reconciler applies it to Serve within a tick. Names are the Serve application's,
so they are unique among live deployments cluster-wide; another project's deployment answers 404.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response, status

from api.deps import ControlPlaneDep, CurrentKey, IdempotencyKey, SessionDep, WriterKey, answer_created
from api.paging import Page
from api.views import deployment_out
from orchestrator.auth import Principal
from orchestrator.db.models import Deployment, DeploymentState
from orchestrator.errors import NotFound
from orchestrator.repositories import deployments as deployments_repo
from orchestrator.use_cases import deployments
from orchestrator_contract.deployments import DeploymentCreate, DeploymentPatch
from orchestrator_contract.rest import DeploymentEventOut, DeploymentOut, Paged

router = APIRouter(prefix="/v1/deployments", tags=["deployments"])


def _deployment_or_404(session, name: str, principal: Principal) -> Deployment:
    deployment = deployments_repo.get_by_name(session, name, principal.project_scope())
    if deployment is None:
        raise NotFound(f"no deployment {name}")
    return deployment


@router.post("", status_code=status.HTTP_201_CREATED, summary="Create a deployment")
def create_deployment(
    body: DeploymentCreate,
    session: SessionDep,
    service: ControlPlaneDep,
    principal: WriterKey,
    response: Response,
    idempotency_key: IdempotencyKey = None,
    project_id: Annotated[str | None, Query(description="Cluster-wide admins only: the project to deploy in.")] = None,
) -> DeploymentOut:
    """Serve a job's best (or latest) checkpoint, or a given checkpoint, at `route_prefix` on Ray Serve. A
    repeated `Idempotency-Key` returns the deployment the first request made (200, `Idempotent-Replayed:
    true`); the same key with another body is 409."""
    deployment, created = deployments.create_deployment(
        session, service.settings, service.backends, principal, body, project_id, idempotency_key
    )
    session.commit()
    answer_created(response, created)
    return deployment_out(deployment, service.serve_urls(session))


@router.get("", summary="List deployments")
def list_deployments(
    session: SessionDep,
    service: ControlPlaneDep,
    principal: CurrentKey,
    page: Page,
    state: Annotated[
        list[DeploymentState] | None, Query(description="Repeat to match any of several; default: all but DELETED.")
    ] = None,
) -> list[DeploymentOut] | Paged[DeploymentOut]:
    """Newest first; paged (X-Next-Cursor)."""
    scope = principal.project_scope()
    deployments = page.fetch(lambda c, n: deployments_repo.list_deployments(session, scope, state, c, n))
    urls = service.serve_urls(session)
    return page.answer([deployment_out(d, urls) for d in deployments])


@router.get("/{name}", summary="Get a deployment")
def get_deployment(name: str, session: SessionDep, service: ControlPlaneDep, principal: CurrentKey) -> DeploymentOut:
    """State and why, the URL, the serving and newest versions, replica states, and every version."""
    return deployment_out(_deployment_or_404(session, name, principal), service.serve_urls(session))


@router.get("/{name}/events", summary="A deployment's state history")
def deployment_events(
    name: str, session: SessionDep, principal: CurrentKey, page: Page
) -> list[DeploymentEventOut] | Paged[DeploymentEventOut]:
    """Oldest first; paged (X-Next-Cursor)."""
    deployment = _deployment_or_404(session, name, principal)
    rows = page.fetch(lambda c, n: deployments_repo.page_events(session, deployment.id, c, n))
    return page.answer([DeploymentEventOut.model_validate(e) for e in rows])


@router.patch("/{name}", summary="Update a deployment (a new version)")
def update_deployment(
    name: str, body: DeploymentPatch, session: SessionDep, service: ControlPlaneDep, principal: WriterKey
) -> DeploymentOut:
    """A new source and/or settings: a new version, rolled out while the current one keeps serving."""
    scope = principal.project_scope()
    deployment = deployments.update_deployment(
        session, service.settings, service.backends, scope, name, body, reading=service.sessions
    )
    session.commit()
    return deployment_out(deployment, service.serve_urls(session))


@router.post("/{name}/rollback", summary="Roll a deployment back")
def rollback_deployment(
    name: str, session: SessionDep, service: ControlPlaneDep, principal: WriterKey
) -> DeploymentOut:
    """Back to the version before the newest (as a new version with its checkpoint and settings)."""
    deployment = deployments.rollback_deployment(session, principal.project_scope(), name)
    session.commit()
    return deployment_out(deployment, service.serve_urls(session))


@router.delete("/{name}", summary="Delete a deployment")
def delete_deployment(name: str, session: SessionDep, service: ControlPlaneDep, principal: WriterKey) -> DeploymentOut:
    """DELETED now; Serve drops the application, and its route answers 404, within a reconciler tick."""
    deployment = deployments.delete_deployment(session, principal.project_scope(), name)
    session.commit()
    return deployment_out(deployment, service.serve_urls(session))
