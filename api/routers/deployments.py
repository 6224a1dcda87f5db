"""Deployments: a committed checkpoint served over HTTP on Ray Serve, updated and rolled back by version.

The routes only change the database (one transaction each, through the deployment transition
function); the serving reconciler applies it to Serve within a tick. Names are the Serve application's,
so they are unique among live deployments cluster-wide; another project's deployment answers 404.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, status

from api.deps import ControlPlaneDep, CurrentKey, SessionDep, WriterKey, target_project
from api.paging import Page
from api.views import deployment_out
from orchestrator.auth import Principal
from orchestrator.db.models import Deployment, DeploymentState
from orchestrator.errors import NotFound
from orchestrator.repositories import deployments as deployments_repo
from orchestrator.scheduling.quotas import check_deployment_quota
from orchestrator.services import deployments as ops
from orchestrator.services.submission import SpecRejected
from orchestrator.states.deployments import lock_deployment
from orchestrator_contract.deployments import DeploymentCreate, DeploymentPatch
from orchestrator_contract.rest import DeploymentEventOut, DeploymentOut

router = APIRouter(prefix="/v1/deployments", tags=["deployments"])


def _deployment_or_404(session, name: str, principal: Principal) -> Deployment:
    deployment = deployments_repo.get_by_name(session, name, principal.project_scope())
    if deployment is None:
        raise NotFound(f"no deployment {name}")
    return deployment


def _locked(session, deployment: Deployment) -> Deployment:
    locked = lock_deployment(session, deployment.id)
    assert locked is not None  # deployments are never removed from the table
    return locked


@router.post("", status_code=status.HTTP_201_CREATED, summary="Create a deployment")
def create_deployment(
    body: DeploymentCreate,
    session: SessionDep,
    service: ControlPlaneDep,
    principal: WriterKey,
    project_id: Annotated[str | None, Query(description="Cluster-wide admins only: the project to deploy in.")] = None,
) -> DeploymentOut:
    """Serve a job's best (or latest) checkpoint, or a given checkpoint, at `route_prefix` on Ray Serve."""
    settings = ops.new_settings(body, service.settings)
    ops.check_resources(
        settings["resources"], service.backend, settings["replicas"]
    )  # asks Ray: before the transaction
    target = target_project(session, principal, project_id)
    check_deployment_quota(session, target, settings)  # 422: its replicas could never fit the project's quota
    resolved = ops.resolve_source(session, body.source, principal.project_scope())
    deployment = ops.create_deployment(session, target, body, resolved, settings)
    session.commit()
    return deployment_out(deployment, service.settings.serve_url)


@router.get("", summary="List deployments")
def list_deployments(
    session: SessionDep,
    service: ControlPlaneDep,
    principal: CurrentKey,
    page: Page,
    state: Annotated[
        list[DeploymentState] | None, Query(description="Repeat to match any of several; default: all but DELETED.")
    ] = None,
) -> list[DeploymentOut]:
    """Newest first; paged (X-Next-Cursor)."""
    scope = principal.project_scope()
    deployments = page.fetch(lambda c, n: deployments_repo.list_deployments(session, scope, state, c, n))
    return [deployment_out(d, service.settings.serve_url) for d in deployments]


@router.get("/{name}", summary="Get a deployment")
def get_deployment(name: str, session: SessionDep, service: ControlPlaneDep, principal: CurrentKey) -> DeploymentOut:
    """State and why, the URL, the serving and newest versions, replica states, and every version."""
    return deployment_out(_deployment_or_404(session, name, principal), service.settings.serve_url)


@router.get("/{name}/events", summary="A deployment's state history")
def deployment_events(name: str, session: SessionDep, principal: CurrentKey, page: Page) -> list[DeploymentEventOut]:
    """Oldest first; paged (X-Next-Cursor)."""
    deployment = _deployment_or_404(session, name, principal)
    rows = page.fetch(lambda c, n: deployments_repo.page_events(session, deployment.id, c, n))
    return [DeploymentEventOut.model_validate(e) for e in rows]


@router.patch("/{name}", summary="Update a deployment (a new version)")
def update_deployment(
    name: str, body: DeploymentPatch, session: SessionDep, service: ControlPlaneDep, principal: WriterKey
) -> DeploymentOut:
    """A new source and/or settings: a new version, rolled out while the current one keeps serving."""
    with service.sessions() as reading:  # released before Ray is asked
        deployment = _deployment_or_404(reading, name, principal)
    if deployment.state == DeploymentState.DELETED:
        raise ops.DeploymentConflict(f"deployment {name} was deleted")
    if body.route_prefix is not None and body.route_prefix != deployment.route_prefix:
        raise SpecRejected(
            ("route_prefix",),
            f"route_prefix is fixed at creation ({deployment.route_prefix}): create a new deployment for another route",
        )
    current = deployment.get_version(deployment.version)
    assert current is not None
    settings = ops.patched_settings(current.settings, body, service.settings)
    if body.resources is not None or body.replicas is not None:
        ops.check_resources(settings["resources"], service.backend, settings["replicas"])
        check_deployment_quota(session, deployment.project_id, settings)
    resolved = ops.resolve_source(session, body.source, principal.project_scope()) if body.source else None
    locked = _locked(session, deployment)
    if locked.version != deployment.version:
        raise ops.DeploymentConflict(f"deployment {name} changed to version {locked.version} meanwhile: try again")
    deployment = ops.update_deployment(session, locked, resolved, body.source, settings)
    session.commit()
    return deployment_out(deployment, service.settings.serve_url)


@router.post("/{name}/rollback", summary="Roll a deployment back")
def rollback_deployment(
    name: str, session: SessionDep, service: ControlPlaneDep, principal: WriterKey
) -> DeploymentOut:
    """Back to the version before the newest (as a new version with its checkpoint and settings)."""
    deployment = _deployment_or_404(session, name, principal)
    deployment = ops.rollback_deployment(session, _locked(session, deployment))
    session.commit()
    return deployment_out(deployment, service.settings.serve_url)


@router.delete("/{name}", summary="Delete a deployment")
def delete_deployment(name: str, session: SessionDep, service: ControlPlaneDep, principal: WriterKey) -> DeploymentOut:
    """DELETED now; Serve drops the application, and its route answers 404, within a reconciler tick."""
    deployment = _deployment_or_404(session, name, principal)
    deployment = ops.delete_deployment(session, _locked(session, deployment))
    session.commit()
    return deployment_out(deployment, service.settings.serve_url)
