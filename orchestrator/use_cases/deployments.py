"""Deployments: create (from the API, or "deploy this" on a job's or a sweep's page), update, roll back, delete.

Each changes the database only; the serving reconciler applies it to Ray Serve within a tick."""

from __future__ import annotations

from collections.abc import Callable

from pydantic import ValidationError
from sqlalchemy.orm import Session

from orchestrator.auth import Principal
from orchestrator.backend.registry import ClusterBackends
from orchestrator.db.models import Deployment, DeploymentState
from orchestrator.errors import Invalid, NotFound
from orchestrator.repositories import deployments as deployments_repo
from orchestrator.repositories import jobs as jobs_repo
from orchestrator.repositories import sweeps as sweeps_repo
from orchestrator.scheduling.quotas import check_deployment_quota
from orchestrator.services import deployments as ops
from orchestrator.services.placement import clusters_for
from orchestrator.services.submission import SpecRejected
from orchestrator.settings import Settings
from orchestrator.states.deployments import lock_deployment
from orchestrator.storage import storage_path_of
from orchestrator.use_cases.idempotency import create_once, request_digest
from orchestrator.use_cases.projects import target_project
from orchestrator_contract.deployments import DeploymentCreate, DeploymentPatch, SourceSpec


def create_deployment(
    session: Session,
    settings: Settings,
    backends: ClusterBackends,
    principal: Principal,
    body: DeploymentCreate,
    project_id: str | None = None,
    idempotency_key: str | None = None,
) -> tuple[Deployment, bool]:
    """``(deployment, created)``: a new deployment of the checkpoint ``body.source`` names (version 1), or the
    one a first request with ``idempotency_key`` made. Its replicas must fit the cluster (asked of Ray first)
    and its project's quota; its name and route must be free."""
    return _create(
        session, settings, backends, principal.project_scope(), body, idempotency_key,
        project=lambda: target_project(session, principal, project_id),
    )  # fmt: skip


def deploy_checkpoint(
    session: Session,
    settings: Settings,
    backends: ClusterBackends,
    scope: str | None,
    name: str,
    source: SourceSpec,
    *,
    job_id: str | None = None,
    sweep_id: str | None = None,
) -> Deployment:
    """The dashboard's "deploy this": a deployment named ``name`` of a checkpoint of job ``job_id`` (``source``
    its ``checkpoint_id``) or of a trial of sweep ``sweep_id`` (``source`` its ``trial_id``), in that run's
    project, made as ``create_deployment`` makes one (every check, in the same order)."""
    try:
        body = DeploymentCreate(name=name, source=source)
    except ValidationError as error:  # the name: say what the rules are
        raise Invalid("; ".join(e["msg"].removeprefix("Value error, ") for e in error.errors())) from None

    def project() -> str:
        if job_id is not None:
            job = jobs_repo.get_job(session, job_id, scope)
            if job is None:
                raise NotFound(f"no job {job_id}")
            return job.project_id
        sweep = sweeps_repo.get_sweep(session, sweep_id or "", scope)
        if sweep is None:
            raise NotFound(f"no sweep {sweep_id}")
        trial = sweeps_repo.get_trial(session, source.trial_id or "", scope)
        if trial is None or trial.sweep_id != sweep.id:
            raise NotFound(f"sweep {sweep.id} has no trial {source.trial_id}")
        return sweep.project_id

    def belongs(resolved: ops.ResolvedSource) -> None:
        if job_id is not None and resolved.job_id != job_id:
            raise NotFound(f"job {job_id} has no checkpoint {source.checkpoint_id}")

    deployment, _ = _create(session, settings, backends, scope, body, None, project=project, check_source=belongs)
    return deployment


def _create(
    session: Session,
    settings: Settings,
    backends: ClusterBackends,
    scope: str | None,
    body: DeploymentCreate,
    idempotency_key: str | None,
    project: Callable[[], str],
    check_source: Callable[[ops.ResolvedSource], None] = lambda _: None,
) -> tuple[Deployment, bool]:
    serving = ops.new_settings(body, settings)
    target = project()
    # 422: a cluster the project may not use; then the one its replicas fit with the most capacity (asks Ray).
    # Only clusters that read the storage the checkpoint was written to: a replica loads it from there.
    candidates = ops.reading_storage_of(
        clusters_for(session, target, body.placement, backends),
        ops.source_cluster(session, body.source, scope),
        _storage_of(session, backends, settings),
    )
    cluster = ops.serving_cluster(candidates, serving)
    digest = request_digest(body)

    def create() -> Deployment:
        check_deployment_quota(session, target, serving, cluster)  # 422: never fits the project's quota (or cap)
        resolved = ops.resolve_source(session, body.source, scope)
        check_source(resolved)
        deployment = ops.create_deployment(session, target, body, resolved, serving, idempotency_key, digest)
        deployment.cluster = cluster  # for its whole life: its Serve application and URL are that cluster's
        return deployment

    return create_once(
        session,
        idempotency_key,
        find=lambda key: deployments_repo.find_by_idempotency_key(session, target, key),
        create=create,
        same_request=lambda deployment: deployment.request_digest == digest,
        what="deployment",
    )


def _storage_of(session: Session, backends: ClusterBackends, settings: Settings) -> Callable[[str | None], str]:
    """A cluster's storage path, by the rule of orchestrator.storage.RunStorages.of (None: a run placed before
    clusters existed, on the service's own storage)."""
    return lambda cluster: storage_path_of(
        backends.storage_root(cluster, session) if cluster else None, settings.storage_path
    )


def _locked(session: Session, scope: str | None, name: str) -> Deployment:
    """The caller's deployment ``name``, locked (another project's is 404)."""
    found = deployments_repo.get_by_name(session, name, scope)
    if found is None:
        raise NotFound(f"no deployment {name}")
    locked = lock_deployment(session, found.id)
    assert locked is not None  # deployments are never removed from the table
    return locked


def update_deployment(
    session: Session,
    settings: Settings,
    backends: ClusterBackends,
    scope: str | None,
    name: str,
    patch: DeploymentPatch,
    reading: Callable[[], Session],
) -> Deployment:
    """A new version (a new source and/or settings), rolled out while the current one keeps serving. The
    deployment is read in ``reading()`` (a session of its own, closed before Ray is asked about new
    resources); DeploymentConflict when it changed meanwhile or was deleted; ``route_prefix`` is fixed."""
    with reading() as first_look:
        deployment = deployments_repo.get_by_name(first_look, name, scope)
        if deployment is None:
            raise NotFound(f"no deployment {name}")
    if deployment.state == DeploymentState.DELETED:
        raise ops.DeploymentConflict(f"deployment {name} was deleted")
    if patch.route_prefix is not None and patch.route_prefix != deployment.route_prefix:
        raise SpecRejected(
            ("route_prefix",),
            f"route_prefix is fixed at creation ({deployment.route_prefix}): create a new deployment for another route",
        )
    current = deployment.get_version(deployment.version)
    assert current is not None
    serving = ops.patched_settings(current.settings, patch, settings)
    if patch.resources is not None or patch.replicas is not None:
        ops.check_resources(serving["resources"], backends.of(deployment, session), serving["replicas"])
        check_deployment_quota(session, deployment.project_id, serving, deployment.cluster or backends.default_name)
    resolved = ops.resolve_source(session, patch.source, scope) if patch.source else None
    if resolved is not None:  # a new checkpoint must be on storage the deployment's cluster reads
        here = deployment.cluster or backends.default_name
        ops.reading_storage_of(
            {here: backends.of(deployment, session)}, resolved.cluster, _storage_of(session, backends, settings)
        )
    locked = _locked(session, scope, name)
    if locked.version != deployment.version:
        raise ops.DeploymentConflict(f"deployment {name} changed to version {locked.version} meanwhile: try again")
    return ops.update_deployment(session, locked, resolved, patch.source, serving)


def rollback_deployment(session: Session, scope: str | None, name: str) -> Deployment:
    """Back to the version before the newest, as a new version with its checkpoint and settings."""
    return ops.rollback_deployment(session, _locked(session, scope, name))


def delete_deployment(session: Session, scope: str | None, name: str) -> Deployment:
    """DELETED now; the serving reconciler drops the Serve application, and its route, within a tick."""
    return ops.delete_deployment(session, _locked(session, scope, name))
