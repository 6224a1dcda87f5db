"""Submitting and cancelling a training job."""

from __future__ import annotations

from sqlalchemy.orm import Session

from orchestrator.admission import demand_of
from orchestrator.auth import Principal
from orchestrator.backend.registry import ClusterBackends
from orchestrator.db.models import Job
from orchestrator.errors import NotFound
from orchestrator.limits import check_preemptible, check_priority
from orchestrator.repositories import jobs as jobs_repo
from orchestrator.scheduling.quotas import check_quota
from orchestrator.services.cancellation import cancel_run
from orchestrator.services.placement import clusters_for
from orchestrator.services.runs import JOBS
from orchestrator.services.submission import check_code, check_runnable, pin_data_paths
from orchestrator.settings import Settings
from orchestrator.use_cases.idempotency import as_stored_today, create_once
from orchestrator.use_cases.projects import target_project
from orchestrator_contract.jobs import JobSpec


def submit_job(
    session: Session,
    settings: Settings,
    backends: ClusterBackends,
    principal: Principal,
    spec: JobSpec,
    project_id: str | None = None,
    idempotency_key: str | None = None,
) -> tuple[Job, bool]:
    """``(job, created)``: a new QUEUED job, planned (strategy, global batch, scaled learning rate), or the one
    a first request with ``idempotency_key`` made. Refused (``orchestrator.errors``) when it can never run on
    this cluster (asked of Ray first), names a data path outside the data roots, a priority above its
    project's cap, a code package it does not have, or could never fit its project's quota (429: its
    project's queue is full)."""
    target = target_project(session, principal, project_id)
    clusters = clusters_for(session, target, spec.placement, backends)  # 422: a cluster the project may not use
    plan = check_runnable(spec, settings, clusters)  # asks Ray whether it fits one of them
    spec = pin_data_paths(spec, settings)  # its data files: inside a data root, resolved
    check_priority(session, target, spec.priority, principal.is_cluster_admin, ("priority",))
    check_preemptible(session, target, spec.preemptible, principal.is_cluster_admin)
    check_code(session, target, spec.code, settings)
    stored = spec.model_dump(mode="json")

    def create() -> Job:
        check_quota(
            session, target, demand_of(spec), preemptible=spec.preemptible, clusters=clusters
        )  # a replay is not counted
        return jobs_repo.create_job(session, target, spec, plan, idempotency_key)

    return create_once(
        session,
        idempotency_key,
        find=lambda key: jobs_repo.find_by_idempotency_key(session, target, key),
        create=create,
        same_request=lambda job: as_stored_today(JobSpec, job.spec) == stored,
        what="job",
    )


def cancel_job(session: Session, backends: ClusterBackends, scope: str | None, job_id: str) -> Job:
    """A queued job ends CANCELLED at once; a running one goes CANCELLING while Ray stops it (the reconciler
    ends it CANCELLED). ``scope``: the caller's project (None: every project); another's job is 404. Commits
    before asking Ray. AlreadyFinished (409) for a job that ended."""
    if jobs_repo.get_job(session, job_id, scope) is None:
        raise NotFound(f"no job {job_id}")
    return cancel_run(session, JOBS, job_id, backends)
