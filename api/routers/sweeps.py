"""Hyperparameter sweeps (Ray Tune over the job runtime) and their trials."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, status
from fastapi.responses import PlainTextResponse

from api.deps import CurrentKey, ServiceDep, SessionDep, WriterKey, target_project
from api.schemas import JobEventOut, SweepOut, TrialMetricOut, TrialOut
from orchestrator.auth import Principal
from orchestrator.db.models import JobState, Sweep, Trial
from orchestrator.repositories import sweeps as sweeps_repo
from orchestrator.services.cancellation import AlreadyFinished, cancel_run
from orchestrator.services.logs import read_logs
from orchestrator.services.runs import SWEEPS
from orchestrator.services.submission import check_sweep_runnable
from workers.sweep_spec import SweepSpec

router = APIRouter(prefix="/v1/sweeps", tags=["sweeps"])
trials_router = APIRouter(prefix="/v1/trials", tags=["sweeps"])


def _sweep_or_404(session, sweep_id: str, principal: Principal) -> Sweep:
    sweep = sweeps_repo.get_sweep(session, sweep_id, principal.project_scope())
    if sweep is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no sweep {sweep_id}")
    return sweep


def _out(session, sweep: Sweep) -> SweepOut:
    best = session.get(Trial, sweep.best_trial_id) if sweep.best_trial_id else None
    return SweepOut.of(sweep, sweeps_repo.trial_counts(session, sweep.id), best)


@router.post("", status_code=status.HTTP_201_CREATED)
def create_sweep(
    spec: SweepSpec,
    session: SessionDep,
    service: ServiceDep,
    principal: WriterKey,
    project_id: Annotated[str | None, Query(description="Cluster-wide admins only: the project to run in.")] = None,
) -> SweepOut:
    """Start a search over the base job's hyperparameters; every trial is a distributed training run."""
    spec = check_sweep_runnable(spec, service.settings, service.backend)  # asks Ray: before the transaction
    sweep = sweeps_repo.create_sweep(session, target_project(session, principal, project_id), spec)
    session.commit()
    return _out(session, sweep)


@router.get("")
def list_sweeps(
    session: SessionDep,
    principal: CurrentKey,
    state: Annotated[list[JobState] | None, Query(description="Repeat to match any of several.")] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
) -> list[SweepOut]:
    """Newest first."""
    return [_out(session, s) for s in sweeps_repo.list_sweeps(session, principal.project_scope(), state, limit)]


@router.get("/{sweep_id}")
def get_sweep(sweep_id: str, session: SessionDep, principal: CurrentKey) -> SweepOut:
    return _out(session, _sweep_or_404(session, sweep_id, principal))


@router.get("/{sweep_id}/trials")
def list_trials(sweep_id: str, session: SessionDep, principal: CurrentKey) -> list[TrialOut]:
    _sweep_or_404(session, sweep_id, principal)
    return [TrialOut.model_validate(t) for t in sweeps_repo.list_trials(session, sweep_id)]


@router.get("/{sweep_id}/events")
def events(sweep_id: str, session: SessionDep, principal: CurrentKey) -> list[JobEventOut]:
    """The sweep's state history."""
    _sweep_or_404(session, sweep_id, principal)
    return [JobEventOut.model_validate(e) for e in sweeps_repo.list_events(session, sweep_id)]


@router.get("/{sweep_id}/logs", response_class=PlainTextResponse)
def logs(
    sweep_id: str,
    service: ServiceDep,
    principal: CurrentKey,
    attempt: Annotated[int | None, Query(ge=1, description="An earlier attempt's output (default: the current one).")] = None,
):
    """The sweep driver's output (Ray Tune's progress, every trial's workers' output) of an attempt."""
    with service.sessions() as session:  # released before Ray is asked
        sweep = _sweep_or_404(session, sweep_id, principal)
    return PlainTextResponse(read_logs(service.backend, service.log_archive, sweep, attempt))


@router.post("/{sweep_id}/cancel")
def cancel(sweep_id: str, session: SessionDep, service: ServiceDep, principal: WriterKey) -> SweepOut:
    """Stops the sweep's driver, and with it every running trial; the sweep and its open trials end CANCELLED."""
    _sweep_or_404(session, sweep_id, principal)
    try:
        sweep = cancel_run(session, SWEEPS, sweep_id, service.backend)
    except AlreadyFinished as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, str(exc)) from None
    return _out(session, sweep)


@trials_router.get("/{trial_id}")
def get_trial(trial_id: str, session: SessionDep, principal: CurrentKey) -> TrialOut:
    return TrialOut.model_validate(_trial_or_404(session, trial_id, principal))


@trials_router.get("/{trial_id}/metrics")
def trial_metrics(trial_id: str, session: SessionDep, principal: CurrentKey) -> list[TrialMetricOut]:
    """One point per epoch the trial ran: what the search compared."""
    _trial_or_404(session, trial_id, principal)
    return [TrialMetricOut.model_validate(m) for m in sweeps_repo.list_trial_metrics(session, trial_id)]


def _trial_or_404(session, trial_id: str, principal: Principal) -> Trial:
    trial = sweeps_repo.get_trial(session, trial_id, principal.project_scope())
    if trial is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no trial {trial_id}")
    return trial
