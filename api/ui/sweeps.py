"""The sweep pages: ``/ui/sweeps`` (a list with server-side paging, filters in the URL) and ``/ui/sweeps/{id}``
(the trial table, every trial's curve on one chart, the hyperparameters against the metric, the best trial with
a deploy button for members), and the JSON they poll (``/ui/api/sweeps...``, ``api.ui.live``).

Every lookup goes through the REST API's repository calls with the user's scope: another project's sweep is a
404 and a list shows nothing of it."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Form, Query, Request
from fastapi.responses import RedirectResponse, Response
from sqlalchemy.orm import Session

from api.deps import ControlPlaneDep, SessionDep
from api.filters import NamePrefix
from api.ui.auth import UiMember, UiUser, UiUserDep
from api.ui.jobs import Cursor, Limit
from api.ui.list_query import list_query
from api.ui.live import etag_of, json_answer, not_modified
from api.ui.templating import render
from api.views import sweep_out
from orchestrator.db.models import JobState, Sweep, Trial, TrialState
from orchestrator.errors import NotFound
from orchestrator.repositories import sweeps as sweeps_repo
from orchestrator.services.downsample import finite, minmax
from orchestrator.states.jobs import TERMINAL
from orchestrator.states.sweeps import TRIAL_TERMINAL
from orchestrator.use_cases.deployments import deploy_checkpoint
from orchestrator.use_cases.sweeps import cancel_sweep
from orchestrator_contract.deployments import SourceSpec
from orchestrator_contract.metrics import POSITION_KEYS

router = APIRouter()
api_router = APIRouter(prefix="/api")

PAGE_SIZES = (25, 50, 100, 200)
MAX_TRIALS_SHOWN = 1000  # trials on the page and its charts (a sweep may run up to 10,000): the first by number
POINTS_PER_TRIAL = 500  # each trial's curve after downsampling (a trial reports once per epoch)

StateFilter = Annotated[list[JobState] | None, Query(description="Repeat to match any of several.")]


# --- what the pages show ------------------------------------------------------------------------------------


def sweep_or_404(session: Session, sweep_id: str, user: UiUser) -> Sweep:
    """The sweep if the user's scope holds it; another project's is simply not found (as in the REST API)."""
    sweep = sweeps_repo.get_sweep(session, sweep_id, user.scope)
    if sweep is None:
        raise NotFound(f"no sweep {sweep_id}")
    return sweep


def sweep_summary(session: Session, sweep: Sweep) -> dict[str, Any]:
    """The REST API's ``SweepOut`` (JSON), with the search's settings the page shows."""
    best = session.get(Trial, sweep.best_trial_id) if sweep.best_trial_id else None
    out = sweep_out(sweep, sweeps_repo.trial_counts(session, sweep.id), best).model_dump(mode="json")
    spec = sweep.spec or {}
    out["algorithm"] = spec.get("algorithm", "")
    out["scheduler"] = (spec.get("scheduler") or {}).get("type", "fifo")
    out["max_concurrent_trials"] = spec.get("max_concurrent_trials")
    out["best_number"] = best.number if best is not None and out["best_trial"] else None
    out["best_deployable"] = bool(out["best_trial"]) and best is not None and best.state in TRIAL_TERMINAL
    out["terminal"] = sweep.state in TERMINAL
    return out


def list_page(session: Session, user: UiUser, state, name, cursor, limit) -> tuple[list[dict], str | None]:
    """One page of the sweeps list: the REST list's query (``sweeps_repo.list_sweeps``) in the user's scope."""
    sweeps, next_cursor = sweeps_repo.list_sweeps(session, user.scope, state, cursor, limit, name)
    rows = []
    for sweep in sweeps:
        out = sweep_summary(session, sweep)
        rows.append(
            {
                key: out[key]
                for key in (
                    "id",
                    "project_id",
                    "name",
                    "workload",
                    "state",
                    "reason",
                    "message",
                    "metric",
                    "mode",
                    "total_trials",
                    "trials",
                    "algorithm",
                    "scheduler",
                    "created_at",
                )
            }
            | {"best": out["best_trial"]["metric"] if out["best_trial"] else None}
        )
    return rows, next_cursor


def trial_row(trial: Trial) -> dict[str, Any]:
    return {
        "id": trial.id,
        "number": trial.number,
        "tune_id": trial.tune_id,
        "state": trial.state.value,
        "reason": trial.reason,
        "message": trial.message,
        "config": trial.config,
        "iterations": trial.iterations,
        "best_metric": trial.best_metric,
        "best_epoch": trial.best_epoch,
        "stopped_early": trial.stopped_early,
        "deployable": trial.state in TRIAL_TERMINAL and trial.best_metric is not None,
    }


def trials_shown(session: Session, sweep: Sweep) -> list[Trial]:
    return sweeps_repo.first_trials(session, sweep.id, MAX_TRIALS_SHOWN)


def curves(session: Session, sweep: Sweep, trials: list[Trial], metric: str, points: bool = True) -> dict[str, Any]:
    """Every trial's curve of ``metric`` by epoch, each downsampled (``minmax``), on one shared x (the union of
    the epochs; a trial without a point at an x has a gap there), and every metric name the trials reported.
    ``points`` False: the names only (``pending``: the page's first poll brings the points)."""
    per_trial: dict[str, tuple[list[float], list[float]]] = {t.id: ([], []) for t in trials}
    # The names to choose from: what each trial reported last (every epoch reports the same names).
    names = {
        name
        for t in trials
        for name, value in (t.latest_metrics or {}).items()
        if name not in POSITION_KEYS and finite(value) is not None
    }
    if trials and points:
        for trial_id, epoch, value in sweeps_repo.metric_by_epoch(session, sweep.id, metric):
            y = finite(value)
            if y is not None and trial_id in per_trial:
                per_trial[trial_id][0].append(float(epoch))
                per_trial[trial_id][1].append(y)
    sampled = {tid: minmax(xs, ys, POINTS_PER_TRIAL) for tid, (xs, ys) in per_trial.items() if xs}
    x = sorted({value for xs, _ in sampled.values() for value in xs})
    index = {value: i for i, value in enumerate(x)}
    series = []
    for trial in trials:
        if trial.id not in sampled:
            continue
        y: list[float | None] = [None] * len(x)
        for xv, yv in zip(*sampled[trial.id], strict=True):
            y[index[xv]] = yv
        series.append({"label": f"trial {trial.number}", "trial_id": trial.id, "y": y})
    names.add(sweep.spec["metric"])
    return {"metric": metric, "metrics": sorted(names), "x": x, "series": series, "pending": not points}


def sweep_detail(session: Session, sweep: Sweep, metric: str | None = None, points: bool = True) -> dict[str, Any]:
    """What the sweep page shows and polls: the sweep, its trials, their curves of ``metric`` (default: the
    sweep's; ``points`` False: none yet) and the searched paths."""
    summary = sweep_summary(session, sweep)
    trials = trials_shown(session, sweep)
    space = (sweep.spec or {}).get("search_space") or {}
    return {
        "sweep": summary,
        "trials": [trial_row(t) for t in trials],
        "trials_total": sum(summary["trials"].values()),
        "curves": curves(session, sweep, trials, metric or summary["metric"], points),
        "params": [{"path": path, "log": dim.get("type") == "loguniform"} for path, dim in sorted(space.items())],
    }


def detail_stamp(session: Session, sweep: Sweep, metric: str | None = None) -> str:
    """A cheap ETag of the sweep page's data: the sweep's and its trials' last changes and their metric points."""
    return etag_of("sweep", sweep.id, sweep.updated_at, *sweeps_repo.last_changes(session, sweep.id), metric)


def deployment_name(sweep: Sweep, trial: Trial) -> str:
    """A name to offer for a deployment of a trial (the Serve application's rules: [a-z0-9-], at most 63)."""
    base = "".join(c if c.isalnum() else "-" for c in (sweep.name or "sweep").lower()).strip("-")[:36] or "sweep"
    return f"{base}-{sweep.id[:8].lower()}-t{trial.number}"


# --- pages --------------------------------------------------------------------------------------------------


@router.get("/sweeps")
def sweeps_page(
    request: Request,
    session: SessionDep,
    user: UiUserDep,
    state: StateFilter = None,
    name: NamePrefix = None,
    cursor: Cursor = None,
    limit: Limit = 50,
) -> Response:
    rows, next_cursor = list_page(session, user, state, name, cursor, limit)
    return render(
        request,
        "sweeps.html",
        user,
        session=session,
        rows=rows,
        states=list(JobState),
        chosen_states={s.value for s in state or []},
        name=name or "",
        limit=limit,
        page_sizes=PAGE_SIZES,
        first_page=cursor is None,
        next_url=f"/ui/sweeps?{list_query(state, limit, next_cursor, name=name)}" if next_cursor else None,
        first_url=f"/ui/sweeps?{list_query(state, limit, name=name)}",
        live_url=f"/ui/api/sweeps?{list_query(state, limit, cursor, name=name)}",
    )


@router.get("/sweeps/{sweep_id}")
def sweep_page(request: Request, sweep_id: str, session: SessionDep, user: UiUserDep) -> Response:
    sweep = sweep_or_404(session, sweep_id, user)
    detail = sweep_detail(session, sweep, points=False)  # the curves come with the page's first poll
    best = session.get(Trial, sweep.best_trial_id) if sweep.best_trial_id else None
    return render(
        request,
        "sweep.html",
        user,
        session=session,
        sweep=detail["sweep"],
        trials=detail["trials"],
        trials_total=detail["trials_total"],
        params=detail["params"],
        trial_states=[s.value for s in TrialState],
        default_deployment=deployment_name(sweep, best) if best is not None else "",
        page={"id": sweep.id, "can_write": user.can_write, "initial": detail},
    )


@router.post("/sweeps/{sweep_id}/deploy")
def deploy_trial(
    sweep_id: str,
    session: SessionDep,
    service: ControlPlaneDep,
    user: UiMember,
    name: Annotated[str, Form(max_length=63)],
    trial_id: Annotated[str, Form(max_length=64)],
) -> Response:
    """A deployment of a trial of this sweep (its best checkpoint by the sweep's metric), made as
    ``POST /v1/deployments`` with ``source: {trial_id}`` makes one (one use-case: ``deploy_checkpoint``), in
    the sweep's project."""
    source = SourceSpec(trial_id=trial_id)
    deployment = deploy_checkpoint(
        session, service.settings, service.backends, user.scope, name, source, sweep_id=sweep_id
    )
    session.commit()
    return RedirectResponse(f"/ui/deployments/{deployment.name}", status_code=303)


@router.post("/sweeps/{sweep_id}/cancel")
def cancel(sweep_id: str, session: SessionDep, service: ControlPlaneDep, user: UiMember) -> Response:
    """The REST cancel (``cancel_run``): a queued sweep ends at once, a running one goes CANCELLING and its
    trials end with it; an ended one is a 409."""
    cancel_sweep(session, service.backends, user.scope, sweep_id)
    return RedirectResponse(f"/ui/sweeps/{sweep_id}", status_code=303)


# --- JSON the pages poll ------------------------------------------------------------------------------------


@api_router.get("/sweeps")
def sweeps_json(
    request: Request,
    session: SessionDep,
    user: UiUserDep,
    state: StateFilter = None,
    name: NamePrefix = None,
    cursor: Cursor = None,
    limit: Limit = 50,
) -> Response:
    """A page of the sweeps list, as the page shows it (the list polls it to update its rows in place)."""
    rows, next_cursor = list_page(session, user, state, name, cursor, limit)
    return json_answer(request, {"items": rows, "next_cursor": next_cursor})


@api_router.get("/sweeps/{sweep_id}")
def sweep_json(
    request: Request,
    sweep_id: str,
    session: SessionDep,
    user: UiUserDep,
    metric: Annotated[
        str | None, Query(max_length=128, description="The curves' metric (default: the sweep's).")
    ] = None,
) -> Response:
    """The sweep, its trials (the first 1,000 by number), every trial's curve of a metric (downsampled) and the
    searched paths. The ETag comes from the rows' last changes: an unchanged sweep reads no points."""
    sweep = sweep_or_404(session, sweep_id, user)
    etag = detail_stamp(session, sweep, metric)
    unchanged = not_modified(request, etag)
    if unchanged is not None:
        return unchanged
    return json_answer(request, sweep_detail(session, sweep, metric), etag)
