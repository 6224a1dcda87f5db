"""Quotas in the database: the policy's inputs (``ProjectQuota``s, what Serve replicas hold per project) and the
checks at submit (a run that could never fit its quota: 422; a full queue: 429)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from orchestrator.admission import Demand, asks_nothing, replicas_demand
from orchestrator.db.models import Job, JobState, Project, Sweep
from orchestrator.errors import Invalid, TooMany
from orchestrator.repositories import deployments as deployments_repo
from orchestrator.scheduling.policy import Holding, ProjectQuota, never_fits_quota
from orchestrator.states.deployments import applied_version

# A full queue drains at the pace of running jobs: minutes, not seconds. What a 429 asks a client to wait.
QUEUE_FULL_RETRY_AFTER_S = 30


class QueueFull(TooMany):
    """The project already has ``max_queued`` runs waiting: 429 with Retry-After."""

    retry_after_s = QUEUE_FULL_RETRY_AFTER_S


def quota_of(project: Project) -> ProjectQuota:
    return ProjectQuota(
        id=project.id,
        name=project.name,
        max_cpus=project.max_cpus,
        max_gpus=project.max_gpus,
        max_running_jobs=project.max_running_jobs,
        max_queued=project.max_queued,
        weight=project.weight,
        borrowing=project.borrowing,
        per_cluster=project.per_cluster or {},
    )


def project_quotas(session: Session, project_ids: Iterable[str]) -> dict[str, ProjectQuota]:
    """The quotas of these projects only (those with queued or active work), not every project's row."""
    ids = sorted(set(project_ids))
    if not ids:
        return {}
    return {p.id: quota_of(p) for p in session.scalars(select(Project).where(Project.id.in_(ids)))}


def serving_holdings(session: Session) -> list[Holding]:
    """Each live deployment's replicas (per replica x most replicas), as its project's holding: they count
    against the project's CPU/GPU quota and the cluster, never against max_running_jobs, never preempted."""
    holdings = []
    for deployment in deployments_repo.live_deployments(session):
        version = applied_version(deployment)  # a QUEUED update: the version that keeps serving
        if version is None:
            continue
        request = replicas_demand(version.settings).total
        if not asks_nothing(request):
            holdings.append(
                Holding(
                    key=f"deployment:{deployment.id}",
                    project_id=deployment.project_id,
                    request=request,
                    is_run=False,
                    preemptible=False,
                    cluster=deployment.cluster,
                )
            )
    return holdings


def check_deployment_quota(session: Session, project_id: str, settings: dict, cluster: str | None = None) -> None:
    """A deployment's replicas (at most ``replicas``, or autoscaling's ``max``) that could never fit its project's
    CPU/GPU quota, or its cap on the deployment's ``cluster`` (``per_cluster``): 422 at create or update, whether or
    not the project may borrow (a deployment never borrows: ``policy.DEPLOYMENTS_DO_NOT_BORROW``). Its replicas are
    not runs, so neither ``max_running_jobs`` nor ``max_queued`` applies."""
    project = session.get(Project, project_id)
    if project is None:
        return
    demand = replicas_demand(settings)
    quota = quota_of(project)
    quota = replace(quota.on_cluster(cluster) if cluster else quota, max_running_jobs=None, borrowing=False)
    impossible = never_fits_quota(quota, demand)
    if impossible:
        raise Invalid(f"this deployment can never run under its project's quota: {impossible}", ("replicas",))


def queued_count(session: Session, project_id: str) -> int:
    """The project's QUEUED jobs and sweeps."""
    return sum(
        session.scalar(
            select(func.count())
            .select_from(model)
            .where(model.project_id == project_id, model.state == JobState.QUEUED)
        )
        or 0
        for model in (Job, Sweep)
    )


def check_quota(
    session: Session,
    project_id: str,
    demand: Demand,
    loc: tuple[str, ...] = ("scaling",),
    preemptible: bool = True,
    clusters: Iterable[str] = (),
) -> None:
    """At submit: 422 when the run could never fit its project's quota (the message says what to change; a run
    that may not be preempted never borrows, so its project's quota binds it), or its caps on every one of the
    ``clusters`` it may be placed on (``per_cluster``); 429 when the project already has ``max_queued`` runs
    waiting."""
    project = session.get(Project, project_id)
    if project is None:
        return
    quota = quota_of(project)
    impossible = never_fits_quota(quota, demand, preemptible)
    if impossible:
        raise Invalid(f"this run can never start under its project's quota: {impossible}", loc)
    names = sorted(clusters)
    capped = {name: never_fits_quota(quota.on_cluster(name), demand, preemptible) for name in names}
    if names and all(capped.values()):
        raise Invalid(
            "this run can never start under its project's caps on the clusters it may use: "
            + "; ".join(f"{name}: {why}" for name, why in capped.items()),
            loc,
        )
    if quota.max_queued is not None:
        queued = queued_count(session, project_id)
        if queued >= quota.max_queued:
            raise QueueFull(
                f"project {quota.label} already has {queued} of {quota.max_queued} runs queued (max_queued): "
                f"retry once some have started, or ask a cluster-wide admin to raise max_queued"
            )
