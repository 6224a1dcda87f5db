"""Sweeps, their trials and trial metrics. Functions take a session and never commit."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from orchestrator.db.models import JobState, Sweep, SweepEvent, Trial, TrialEvent, TrialMetric, TrialState
from orchestrator.repositories.by_ids import rows_for_ids
from orchestrator.repositories.jobs import runs_for_checkpoint_upkeep
from orchestrator.repositories.names import name_starts_with
from orchestrator.repositories.paging import fetch_page
from orchestrator.states.jobs import ACTIVE, REQUESTS
from orchestrator.states.sweeps import record_sweep_created, record_trial_created
from orchestrator_contract.sweeps import SweepSpec


def create_sweep(session: Session, project_id: str, spec: SweepSpec, idempotency_key: str | None = None) -> Sweep:
    sweep = Sweep(
        project_id=project_id,
        name=spec.name,
        workload=spec.base.runs,
        spec=spec.model_dump(mode="json"),
        priority=spec.priority,
        idempotency_key=idempotency_key,
    )
    session.add(sweep)
    session.flush()
    record_sweep_created(session, sweep)
    session.flush()
    return sweep


def find_by_idempotency_key(session: Session, project_id: str, key: str) -> Sweep | None:
    return session.scalars(
        select(Sweep).where(Sweep.project_id == project_id, Sweep.idempotency_key == key)
    ).one_or_none()


def get_sweep(session: Session, sweep_id: str, project_scope: str | None) -> Sweep | None:
    """``project_scope`` None means any project (admins); another project's sweep is simply not found."""
    sweep = session.get(Sweep, sweep_id)
    if sweep is None or (project_scope is not None and sweep.project_id != project_scope):
        return None
    return sweep


def list_sweeps(
    session: Session,
    project_scope: str | None,
    states: list[JobState] | None,
    cursor: str | None,
    limit: int,
    name_prefix: str | None = None,
) -> tuple[list[Sweep], str | None]:
    """Newest first: a page and the next page's cursor (None on the last)."""
    query = select(Sweep)
    if project_scope is not None:
        query = query.where(Sweep.project_id == project_scope)
    if states:
        query = query.where(Sweep.state.in_(states))
    if name_prefix:
        query = query.where(name_starts_with(Sweep.name, name_prefix))
    return fetch_page(session, query, (Sweep.created_at, Sweep.id), cursor, limit, descending=True)


def queued_sweeps(session: Session) -> list[Sweep]:
    return list(
        session.scalars(
            select(Sweep)
            .where(Sweep.state == JobState.QUEUED)
            .order_by(Sweep.priority.desc(), Sweep.created_at, Sweep.id)
        )
    )


def active_sweeps(session: Session) -> list[Sweep]:
    return list(session.scalars(select(Sweep).where(Sweep.state.in_(ACTIVE)).order_by(Sweep.created_at)))


def list_events(session: Session, sweep_id: str) -> list[SweepEvent]:
    return list(session.scalars(select(SweepEvent).where(SweepEvent.sweep_id == sweep_id).order_by(SweepEvent.id)))


def page_events(session: Session, sweep_id: str, cursor: str | None, limit: int) -> tuple[list[SweepEvent], str | None]:
    return fetch_page(
        session, select(SweepEvent).where(SweepEvent.sweep_id == sweep_id), (SweepEvent.id,), cursor, limit
    )


def last_transition(session: Session, sweep_id: str) -> SweepEvent:
    return session.scalars(
        select(SweepEvent)
        .where(SweepEvent.sweep_id == sweep_id, SweepEvent.reason.not_in(REQUESTS))
        .order_by(SweepEvent.id.desc())
        .limit(1)
    ).one()


# --- trials ---------------------------------------------------------------------------------------


def list_trials(session: Session, sweep_id: str) -> list[Trial]:
    return list(session.scalars(select(Trial).where(Trial.sweep_id == sweep_id).order_by(Trial.number)))


def running_trials(session: Session, sweep_id: str) -> list[Trial]:
    """The sweep's RUNNING trials: what its control signal (deadlines, hangs) is about, polled by every trial rank."""
    query = select(Trial).where(Trial.sweep_id == sweep_id, Trial.state == TrialState.RUNNING).order_by(Trial.number)
    return list(session.scalars(query))


def page_trials(session: Session, sweep_id: str, cursor: str | None, limit: int) -> tuple[list[Trial], str | None]:
    """By number, as ``list_trials`` (the id breaks a tie)."""
    return fetch_page(session, select(Trial).where(Trial.sweep_id == sweep_id), (Trial.number, Trial.id), cursor, limit)


def get_trial(session: Session, trial_id: str, project_scope: str | None) -> Trial | None:
    trial = session.get(Trial, trial_id)
    if trial is None or get_sweep(session, trial.sweep_id, project_scope) is None:
        return None
    return trial


def list_trial_events(session: Session, trial_id: str) -> list[TrialEvent]:
    """A trial's state history, oldest first: its creation (PENDING) and every transition."""
    return list(session.scalars(select(TrialEvent).where(TrialEvent.trial_id == trial_id).order_by(TrialEvent.id)))


def trial_histories(session: Session, trial_ids: list[str]) -> dict[str, list[TrialEvent]]:
    """``list_trial_events`` of each trial, in one query (through the trial events' index) however many."""
    histories: dict[str, list[TrialEvent]] = {trial_id: [] for trial_id in trial_ids}
    rows = rows_for_ids(session, lambda condition: select(TrialEvent).where(condition), TrialEvent.trial_id, trial_ids)
    for (event,) in sorted(rows, key=lambda row: row[0].id):
        histories[event.trial_id].append(event)
    return histories


def trial_progress(session: Session, trial_ids: list[str], limit: int = 50) -> dict[str, list[datetime]]:
    """When each trial's latest epochs (at most ``limit`` per trial) arrived, oldest first: a trial's hang
    detection's evidence of progress (``services.trial_hangs``). One query, through the trial metrics' index."""
    progress: dict[str, list[datetime]] = {trial_id: [] for trial_id in trial_ids}
    rows = rows_for_ids(
        session,
        lambda condition: select(TrialMetric.trial_id, TrialMetric.created_at).where(condition),
        TrialMetric.trial_id,
        trial_ids,
    )
    for trial_id, created_at in rows:
        progress[trial_id].append(created_at)
    return {trial_id: sorted(times)[-limit:] for trial_id, times in progress.items()}


def page_trial_events(
    session: Session, trial_id: str, cursor: str | None, limit: int
) -> tuple[list[TrialEvent], str | None]:
    """``list_trial_events`` a page at a time (GET /v1/trials/{id}/events), as a job's or a sweep's events."""
    return fetch_page(
        session, select(TrialEvent).where(TrialEvent.trial_id == trial_id), (TrialEvent.id,), cursor, limit
    )


def find_trial(session: Session, sweep_id: str, tune_id: str) -> Trial | None:
    return session.scalars(select(Trial).where(Trial.sweep_id == sweep_id, Trial.tune_id == tune_id)).one_or_none()


def add_trial(session: Session, sweep_id: str, tune_id: str, config: dict[str, Any]) -> Trial:
    """A trial the search just created, numbered in the order the search created it: Tune's trial ids end
    in that index (``<experiment>_00003``); else in the order the control plane heard of them."""
    _, _, index = tune_id.rpartition("_")
    if index.isdigit():
        number = int(index) + 1
    else:
        number = (session.scalar(select(func.max(Trial.number)).where(Trial.sweep_id == sweep_id)) or 0) + 1
    trial = Trial(sweep_id=sweep_id, tune_id=tune_id, number=number, config=dict(config))
    session.add(trial)
    session.flush()
    record_trial_created(session, trial)
    return trial


def trial_counts(session: Session, sweep_id: str) -> dict[str, int]:
    """How many trials are in each state (every state listed, 0 included)."""
    counts = dict.fromkeys((s.value for s in TrialState), 0)
    rows = session.execute(select(Trial.state, func.count()).where(Trial.sweep_id == sweep_id).group_by(Trial.state))
    for state, count in rows:
        counts[TrialState(state).value] = count
    return counts


def record_trial_metric(
    session: Session, trial: Trial, epoch: int, step: int, values: dict[str, Any], checkpoint_path: str | None = None
) -> None:
    """Idempotent on (trial, epoch): a re-sent point merges into the stored one."""
    point = session.scalars(
        select(TrialMetric).where(TrialMetric.trial_id == trial.id, TrialMetric.epoch == epoch)
    ).one_or_none()
    if point is None:
        session.add(
            TrialMetric(trial_id=trial.id, epoch=epoch, step=step, values=dict(values), checkpoint_path=checkpoint_path)
        )
    else:
        point.values = {**point.values, **values}
        if checkpoint_path:
            point.checkpoint_path = checkpoint_path


def list_trial_metrics(session: Session, trial_id: str) -> list[TrialMetric]:
    return list(
        session.scalars(select(TrialMetric).where(TrialMetric.trial_id == trial_id).order_by(TrialMetric.epoch))
    )


def page_trial_metrics(
    session: Session, trial_id: str, cursor: str | None, limit: int
) -> tuple[list[TrialMetric], str | None]:
    """By epoch, as ``list_trial_metrics`` (a point is unique on it)."""
    query = select(TrialMetric).where(TrialMetric.trial_id == trial_id)
    return fetch_page(session, query, (TrialMetric.epoch,), cursor, limit)


def trial_checkpoints(session: Session, trial_id: str) -> list[TrialMetric]:
    """The trial's epochs that still have a checkpoint, oldest first."""
    return list(
        session.scalars(
            select(TrialMetric)
            .where(TrialMetric.trial_id == trial_id, TrialMetric.checkpoint_path.is_not(None))
            .order_by(TrialMetric.epoch)
        )
    )


def sweep_checkpoints(session: Session, sweep_id: str) -> list[tuple[Trial, TrialMetric]]:
    """Every trial epoch of the sweep that still has a checkpoint."""
    rows = session.execute(
        select(Trial, TrialMetric)
        .join(TrialMetric, TrialMetric.trial_id == Trial.id)
        .where(Trial.sweep_id == sweep_id, TrialMetric.checkpoint_path.is_not(None))
        .order_by(Trial.number, TrialMetric.epoch)
    )
    return [(trial, point) for trial, point in rows]


def forget_trial_checkpoints(session: Session, trial_id: str, paths: set[str]) -> int:
    """Clear the checkpoint of the trial's epochs whose folder is one of ``paths`` (deleted or gone)."""
    points = [p for p in trial_checkpoints(session, trial_id) if p.checkpoint_path in paths]
    for point in points:
        point.checkpoint_path = None
    session.flush()
    return len(points)


def sweeps_for_checkpoint_upkeep(session: Session, finished_since: datetime | None) -> list[tuple[str, JobState]]:
    return runs_for_checkpoint_upkeep(session, Sweep, finished_since)


# --- what the dashboard's sweep pages read --------------------------------------------------------------


def first_trials(session: Session, sweep_id: str, limit: int) -> list[Trial]:
    """The sweep's first ``limit`` trials by number."""
    query = select(Trial).where(Trial.sweep_id == sweep_id).order_by(Trial.number, Trial.id).limit(limit)
    return list(session.scalars(query))


def metric_by_epoch(session: Session, sweep_id: str, metric: str) -> list[tuple[str, int, float | None]]:
    """``(trial id, epoch, value)`` of one metric for every point of the sweep's trials, by trial then epoch: only
    that metric's value of each point is read, as a number (the database extracts it from the JSON)."""
    rows = session.execute(
        select(TrialMetric.trial_id, TrialMetric.epoch, TrialMetric.values[metric].as_float())
        .join(Trial, Trial.id == TrialMetric.trial_id)
        .where(Trial.sweep_id == sweep_id)
        .order_by(TrialMetric.trial_id, TrialMetric.epoch)
    )
    return [tuple(row) for row in rows]


def last_changes(session: Session, sweep_id: str) -> tuple:
    """What changes whenever the sweep page's data does: its trials' last update and count, its metric points'
    count and last id."""
    trials_changed, trials = session.execute(
        select(func.max(Trial.updated_at), func.count(Trial.id)).where(Trial.sweep_id == sweep_id)
    ).one()
    points, last_point = session.execute(
        select(func.count(TrialMetric.id), func.max(TrialMetric.id))
        .join(Trial, Trial.id == TrialMetric.trial_id)
        .where(Trial.sweep_id == sweep_id)
    ).one()
    return trials_changed, trials, points, last_point


def queued_in_admission_order(session: Session, scope: str | None, limit: int) -> list[Sweep]:
    """The QUEUED sweeps of ``scope`` (None: every project) in admission order: priority, then age."""
    query = select(Sweep).where(Sweep.state == JobState.QUEUED)
    if scope is not None:
        query = query.where(Sweep.project_id == scope)
    return list(session.scalars(query.order_by(Sweep.priority.desc(), Sweep.created_at, Sweep.id).limit(limit)))
