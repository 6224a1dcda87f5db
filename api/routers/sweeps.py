"""Hyperparameter sweeps (Ray Tune over the job runtime) and their trials."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response, status
from fastapi.responses import PlainTextResponse

from api.deps import ControlPlaneDep, CurrentKey, IdempotencyKey, SessionDep, WriterKey, answer_created
from api.filters import NamePrefix
from api.paging import MetricsPage, Page
from api.views import sweep_out
from orchestrator.auth import Principal
from orchestrator.db.models import JobState, Sweep, Trial
from orchestrator.errors import NotFound
from orchestrator.repositories import sweeps as sweeps_repo
from orchestrator.services.log_lines import view
from orchestrator.services.logs import last_lines, read_logs
from orchestrator.use_cases.sweeps import cancel_sweep, submit_sweep
from orchestrator_contract.rest import JobEventOut, Paged, SweepOut, TrialEventOut, TrialMetricOut, TrialOut
from orchestrator_contract.sweeps import SweepSpec

router = APIRouter(prefix="/v1/sweeps", tags=["sweeps"])
trials_router = APIRouter(prefix="/v1/trials", tags=["sweeps"])


def _sweep_or_404(session, sweep_id: str, principal: Principal) -> Sweep:
    sweep = sweeps_repo.get_sweep(session, sweep_id, principal.project_scope())
    if sweep is None:
        raise NotFound(f"no sweep {sweep_id}")
    return sweep


def _out(session, sweep: Sweep) -> SweepOut:
    best = session.get(Trial, sweep.best_trial_id) if sweep.best_trial_id else None
    return sweep_out(sweep, sweeps_repo.trial_counts(session, sweep.id), best)


@router.post("", status_code=status.HTTP_201_CREATED, summary="Start a sweep")
def create_sweep(
    spec: SweepSpec,
    session: SessionDep,
    service: ControlPlaneDep,
    principal: WriterKey,
    response: Response,
    idempotency_key: IdempotencyKey = None,
    project_id: Annotated[str | None, Query(description="Cluster-wide admins only: the project to run in.")] = None,
) -> SweepOut:
    """Start a search over the base job's hyperparameters; every trial is a distributed training run. A
    repeated `Idempotency-Key` returns the sweep the first request made (200, `Idempotent-Replayed: true`);
    the same key with another spec is 409."""
    sweep, created = submit_sweep(
        session, service.settings, service.backends, principal, spec, project_id, idempotency_key
    )
    session.commit()
    if created:  # admitted now if it fits, not at the scheduler's next tick
        service.wake_scheduler()
    answer_created(response, created)
    return _out(session, sweep)


@router.get("", summary="List sweeps")
def list_sweeps(
    session: SessionDep,
    principal: CurrentKey,
    page: Page,
    state: Annotated[list[JobState] | None, Query(description="Repeat to match any of several.")] = None,
    name_prefix: NamePrefix = None,
) -> list[SweepOut] | Paged[SweepOut]:
    """Newest first, filtered by state and the start of the name; paged (X-Next-Cursor)."""
    scope = principal.project_scope()
    rows = page.fetch(lambda c, n: sweeps_repo.list_sweeps(session, scope, state, c, n, name_prefix))
    return page.answer([_out(session, s) for s in rows])


@router.get("/{sweep_id}", summary="Get a sweep")
def get_sweep(sweep_id: str, session: SessionDep, principal: CurrentKey) -> SweepOut:
    """Its state and why, how many trials are in each state, and the best trial so far."""
    return _out(session, _sweep_or_404(session, sweep_id, principal))


@router.get("/{sweep_id}/trials", summary="List a sweep's trials")
def list_trials(
    sweep_id: str, session: SessionDep, principal: CurrentKey, page: Page
) -> list[TrialOut] | Paged[TrialOut]:
    """By number; paged (X-Next-Cursor)."""
    _sweep_or_404(session, sweep_id, principal)
    return page.answer(
        [TrialOut.model_validate(t) for t in page.fetch(lambda c, n: sweeps_repo.page_trials(session, sweep_id, c, n))]
    )


@router.get("/{sweep_id}/events", summary="A sweep's state history")
def events(
    sweep_id: str, session: SessionDep, principal: CurrentKey, page: Page
) -> list[JobEventOut] | Paged[JobEventOut]:
    """The sweep's state history, oldest first; paged (X-Next-Cursor)."""
    _sweep_or_404(session, sweep_id, principal)
    return page.answer(
        [
            JobEventOut.model_validate(e)
            for e in page.fetch(lambda c, n: sweeps_repo.page_events(session, sweep_id, c, n))
        ]
    )


@router.get("/{sweep_id}/logs", response_class=PlainTextResponse, summary="A sweep driver's output")
def logs(
    sweep_id: str,
    service: ControlPlaneDep,
    principal: CurrentKey,
    attempt: Annotated[
        int | None, Query(ge=1, description="An earlier attempt's output (default: the current one).")
    ] = None,
    tail: Annotated[int | None, Query(ge=0, le=1_000_000, description="Only the last N lines.")] = None,
):
    """The sweep driver's output (Ray Tune's progress, every trial's workers' output) of an attempt, without
    escape codes or Ray Train's per-report lines (unless ORCHESTRATOR_LOG_RAY_CHATTER)."""
    with service.sessions() as session:  # released before Ray is asked
        sweep = _sweep_or_404(session, sweep_id, principal)
    text = view(read_logs(service.backends, service.log_archive, sweep, attempt), service.settings.log_ray_chatter)
    return PlainTextResponse(last_lines(text, tail))


@router.post("/{sweep_id}/cancel", summary="Cancel a sweep")
def cancel(sweep_id: str, session: SessionDep, service: ControlPlaneDep, principal: WriterKey) -> SweepOut:
    """Stops the sweep's driver, and with it every running trial; the sweep and its open trials end CANCELLED."""
    sweep = cancel_sweep(session, service.backends, principal.project_scope(), sweep_id)  # AlreadyFinished: 409
    return _out(session, sweep)


@trials_router.get("/{trial_id}", summary="Get a trial")
def get_trial(trial_id: str, session: SessionDep, principal: CurrentKey) -> TrialOut:
    """Its searched config, state, epochs run, best metric and the checkpoint of its best epoch."""
    return TrialOut.model_validate(_trial_or_404(session, trial_id, principal))


@trials_router.get("/{trial_id}/metrics", summary="A trial's metrics")
def trial_metrics(
    trial_id: str, session: SessionDep, principal: CurrentKey, page: MetricsPage
) -> list[TrialMetricOut] | Paged[TrialMetricOut]:
    """One point per epoch the trial ran: what the search compared. By epoch; paged (X-Next-Cursor)."""
    _trial_or_404(session, trial_id, principal)
    rows = page.fetch(lambda c, n: sweeps_repo.page_trial_metrics(session, trial_id, c, n))
    return page.answer([TrialMetricOut.model_validate(m) for m in rows])


@trials_router.get("/{trial_id}/events", summary="A trial's state history")
def trial_events(
    trial_id: str, session: SessionDep, principal: CurrentKey, page: Page
) -> list[TrialEventOut] | Paged[TrialEventOut]:
    """The trial's state history, oldest first: its creation and every transition; paged (X-Next-Cursor)."""
    _trial_or_404(session, trial_id, principal)
    rows = page.fetch(lambda c, n: sweeps_repo.page_trial_events(session, trial_id, c, n))
    return page.answer([TrialEventOut.model_validate(e) for e in rows])


def _trial_or_404(session, trial_id: str, principal: Principal) -> Trial:
    trial = sweeps_repo.get_trial(session, trial_id, principal.project_scope())
    if trial is None:
        raise NotFound(f"no trial {trial_id}")
    return trial
