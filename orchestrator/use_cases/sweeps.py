"""Starting and cancelling a hyperparameter sweep."""

from __future__ import annotations

from sqlalchemy.orm import Session

from orchestrator.admission import sweep_demand
from orchestrator.auth import Principal
from orchestrator.backend.registry import ClusterBackends
from orchestrator.db.models import Sweep
from orchestrator.errors import NotFound
from orchestrator.limits import check_preemptible, check_priority
from orchestrator.repositories import sweeps as sweeps_repo
from orchestrator.scheduling.quotas import check_quota
from orchestrator.services.cancellation import cancel_run
from orchestrator.services.placement import clusters_for
from orchestrator.services.runs import SWEEPS
from orchestrator.services.submission import check_code, check_sweep_runnable
from orchestrator.settings import Settings
from orchestrator.use_cases.idempotency import as_stored_today, create_once
from orchestrator.use_cases.projects import target_project
from orchestrator_contract.sweeps import SweepSpec


def submit_sweep(
    session: Session,
    settings: Settings,
    backends: ClusterBackends,
    principal: Principal,
    spec: SweepSpec,
    project_id: str | None = None,
    idempotency_key: str | None = None,
) -> tuple[Sweep, bool]:
    """``(sweep, created)``: a new QUEUED sweep, or the one a first request with ``idempotency_key`` made. Its
    base job is checked as a job is (``jobs.submit_job``), its metric must be one the base reports, and its
    concurrent trials must fit the cluster and the project's quota."""
    target = target_project(session, principal, project_id)
    clusters = clusters_for(session, target, spec.run_placement, backends)  # 422: not the project's
    spec = check_sweep_runnable(spec, settings, clusters)  # asks Ray whether it fits one of them
    for priority, loc in ((spec.priority, ("priority",)), (spec.base.priority, ("base", "priority"))):
        check_priority(session, target, priority, principal.is_cluster_admin, loc)
    check_preemptible(session, target, spec.may_be_preempted, principal.is_cluster_admin)
    check_code(session, target, spec.base.code, settings, ("base",))
    stored = spec.model_dump(mode="json")

    def create() -> Sweep:
        check_quota(  # 422 never fits its quota (one that may not be preempted never borrows); 429 a full queue
            session,
            target,
            sweep_demand(spec),
            ("max_concurrent_trials",),
            preemptible=spec.may_be_preempted,
            clusters=clusters,
        )
        return sweeps_repo.create_sweep(session, target, spec, idempotency_key)

    return create_once(
        session,
        idempotency_key,
        find=lambda key: sweeps_repo.find_by_idempotency_key(session, target, key),
        create=create,
        same_request=lambda sweep: as_stored_today(SweepSpec, sweep.spec) == stored,
        what="sweep",
    )


def cancel_sweep(session: Session, backends: ClusterBackends, scope: str | None, sweep_id: str) -> Sweep:
    """Stops the sweep's driver, and with it every running trial; the sweep and its open trials end CANCELLED
    (a queued sweep at once). Commits before asking Ray. AlreadyFinished (409) for a sweep that ended."""
    if sweeps_repo.get_sweep(session, sweep_id, scope) is None:
        raise NotFound(f"no sweep {sweep_id}")
    return cancel_run(session, SWEEPS, sweep_id, backends)
