from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Select, delete, func, or_, select
from sqlalchemy.orm import Session, load_only, raiseload

from orchestrator.db.models import Checkpoint, Job, JobEvent, JobLabel, JobMetric, JobState
from orchestrator.repositories.by_ids import rows_for_ids
from orchestrator.repositories.names import name_starts_with
from orchestrator.repositories.paging import fetch_page
from orchestrator.states.jobs import ACTIVE, REQUESTS, record_job_created
from orchestrator_contract.jobs import JobSpec, TrainingPlan


def create_job(
    session: Session, project_id: str, spec: JobSpec, plan: TrainingPlan, idempotency_key: str | None
) -> Job:
    job = Job(
        project_id=project_id,
        name=spec.name,
        workload=spec.runs,
        spec=spec.model_dump(mode="json"),
        plan=plan.model_dump(mode="json"),
        priority=spec.priority,
        idempotency_key=idempotency_key,
        token_hash="",
        labels=[JobLabel(key=k, value=v) for k, v in spec.labels.items()],
    )
    session.add(job)
    session.flush()  # assigns the id
    record_job_created(session, job)
    session.flush()
    return job


def get_job(session: Session, job_id: str, project_scope: str | None) -> Job | None:
    """``project_scope`` None means any project (admins); another project's job is simply not found."""
    job = session.get(Job, job_id)
    if job is None or (project_scope is not None and job.project_id != project_scope):
        return None
    return job


def find_by_idempotency_key(session: Session, project_id: str, key: str) -> Job | None:
    return session.scalars(select(Job).where(Job.project_id == project_id, Job.idempotency_key == key)).one_or_none()


def list_jobs(
    session: Session,
    project_scope: str | None,
    states: list[JobState] | None = None,
    labels: dict[str, str] | None = None,
    cursor: str | None = None,
    limit: int = 50,
    name_prefix: str | None = None,
) -> tuple[list[Job], str | None]:
    """Newest first. Returns a page and the cursor of the next page (None at the end)."""
    query = select(Job)
    if project_scope is not None:
        query = query.where(Job.project_id == project_scope)
    if states:
        query = query.where(Job.state.in_(states))
    if name_prefix:
        query = query.where(name_starts_with(Job.name, name_prefix))
    for key, value in (labels or {}).items():
        query = query.where(Job.id.in_(select(JobLabel.job_id).where(JobLabel.key == key, JobLabel.value == value)))
    return fetch_page(session, query, (Job.created_at, Job.id), cursor, limit, descending=True)


def queued_jobs(session: Session) -> list[Job]:
    """Admission order: priority, then age. Only the columns admission reads (the spec for the demand, the
    reason it waits) and no labels: the scheduler reads every queued job every tick, and with hundreds
    queued the other JSON columns and the labels' query were most of the tick (bench/api_load.py)."""
    admission = load_only(
        Job.id,
        Job.project_id,
        Job.state,
        Job.priority,
        Job.created_at,
        Job.queued_at,  # the starvation guard's clock
        Job.last_preempted_at,  # a requeued run's waiting message names its preemption
        Job.last_preempted_by,
        Job.spec,
        Job.reason,
        Job.message,
        Job.cluster,  # placed before: it stays there (scheduling.placement)
        Job.waiting_on,  # the cluster it was last noted waiting for
    )
    query = select(Job).where(Job.state == JobState.QUEUED).options(admission, raiseload(Job.labels))
    return list(session.scalars(query.order_by(Job.priority.desc(), Job.created_at, Job.id)))


def count_by_state(session: Session, project_scope: str | None) -> dict[JobState, int]:
    """How many jobs are in each state (every state, 0 included); ``project_scope`` None: every project."""
    query = select(Job.state, func.count()).group_by(Job.state)
    if project_scope is not None:
        query = query.where(Job.project_id == project_scope)
    counts = dict.fromkeys(JobState, 0)
    counts.update({state: n for state, n in session.execute(query)})
    return counts


def queued_in_scope(session: Session, project_scope: str | None, limit: int) -> list[Job]:
    """The first ``limit`` QUEUED jobs in admission order (``queued_jobs``'), of one project or of all."""
    query = select(Job).where(Job.state == JobState.QUEUED)
    if project_scope is not None:
        query = query.where(Job.project_id == project_scope)
    return list(session.scalars(query.order_by(Job.priority.desc(), Job.created_at, Job.id).limit(limit)))


def ids_in_scope(session: Session, job_ids: set[str], project_scope: str | None) -> set[str]:
    """Those of ``job_ids`` that are jobs of ``project_scope`` (None: every one that exists)."""

    def query(condition: ColumnElement[bool]) -> Select:
        query = select(Job.id).where(condition)
        return query if project_scope is None else query.where(Job.project_id == project_scope)

    return {row.id for row in rows_for_ids(session, query, Job.id, sorted(job_ids))}


def active_jobs(session: Session) -> list[Job]:
    return list(session.scalars(select(Job).where(Job.state.in_(ACTIVE)).order_by(Job.created_at)))


def list_events(session: Session, job_id: str) -> list[JobEvent]:
    return list(session.scalars(select(JobEvent).where(JobEvent.job_id == job_id).order_by(JobEvent.id)))


def last_transition(session: Session, job_id: str) -> JobEvent:
    """The history row of how the job entered its current state (a request's row, e.g. ``preempting``, is not one)."""
    return session.scalars(
        select(JobEvent)
        .where(JobEvent.job_id == job_id, JobEvent.reason.not_in(REQUESTS))
        .order_by(JobEvent.id.desc())
        .limit(1)
    ).one()


def list_metrics(session: Session, job_id: str) -> list[JobMetric]:
    return list(
        session.scalars(select(JobMetric).where(JobMetric.job_id == job_id).order_by(JobMetric.attempt, JobMetric.step))
    )


def progress_of_attempt(session: Session, job_id: str, attempt: int, limit: int = 50) -> list[datetime]:
    """When the attempt's latest metric points (at most ``limit``, by step) and its latest committed checkpoint
    arrived, oldest first: hang detection's evidence of progress. Both read through their (job, attempt, step)
    and (job, step) indexes."""
    metrics = session.scalars(
        select(JobMetric.created_at)
        .where(JobMetric.job_id == job_id, JobMetric.attempt == attempt)
        .order_by(JobMetric.step.desc())
        .limit(limit)
    ).all()
    checkpoint = session.scalars(
        select(Checkpoint.created_at)
        .where(Checkpoint.job_id == job_id, Checkpoint.attempt == attempt)
        .order_by(Checkpoint.step.desc())
        .limit(1)
    ).all()
    return sorted([*metrics, *checkpoint])


@dataclass
class GoodputEvidence:
    """A job's evidence for ``orchestrator.services.goodput``: its history (oldest first, requests included),
    when each committed checkpoint arrived, each attempt's last report (metric point or checkpoint), and the
    checkpoint blocking each metric point carried (when it arrived, seconds)."""

    history: list[JobEvent] = field(default_factory=list)
    checkpoints: list[datetime] = field(default_factory=list)
    last_report_of_attempt: dict[int, datetime] = field(default_factory=dict)
    blocked: list[tuple[datetime, float]] = field(default_factory=list)


def goodput_evidence(session: Session, job_ids: list[str]) -> dict[str, GoodputEvidence]:
    """Each job's ``GoodputEvidence``, in four queries whatever the number of jobs (through the history's,
    the checkpoints' and the metric points' job indexes)."""
    found = {job_id: GoodputEvidence() for job_id in job_ids}
    events = rows_for_ids(
        session,
        lambda condition: select(JobEvent).where(condition).order_by(JobEvent.job_id, JobEvent.id),
        JobEvent.job_id,
        job_ids,
    )
    for (event,) in events:
        found[event.job_id].history.append(event)
    checkpoints = rows_for_ids(
        session,
        lambda condition: select(Checkpoint.job_id, Checkpoint.attempt, Checkpoint.created_at).where(condition),
        Checkpoint.job_id,
        job_ids,
    )
    last_metrics = rows_for_ids(
        session,
        lambda condition: (
            select(JobMetric.job_id, JobMetric.attempt, func.max(JobMetric.created_at))
            .where(condition)
            .group_by(JobMetric.job_id, JobMetric.attempt)
        ),
        JobMetric.job_id,
        job_ids,
    )
    blocked = rows_for_ids(
        session,
        lambda condition: select(JobMetric.job_id, JobMetric.created_at, JobMetric.checkpoint_blocked_s).where(
            condition, JobMetric.checkpoint_blocked_s > 0
        ),
        JobMetric.job_id,
        job_ids,
    )
    for job_id, at, seconds in blocked:
        found[job_id].blocked.append((at, seconds))
    for job_id, _attempt, at in checkpoints:
        found[job_id].checkpoints.append(at)
    for job_id, attempt, at in [*last_metrics, *checkpoints]:
        last = found[job_id].last_report_of_attempt
        if at is not None and (attempt not in last or at > last[attempt]):
            last[attempt] = at
    return found


def page_events(session: Session, job_id: str, cursor: str | None, limit: int) -> tuple[list[JobEvent], str | None]:
    return fetch_page(session, select(JobEvent).where(JobEvent.job_id == job_id), (JobEvent.id,), cursor, limit)


def page_metrics(session: Session, job_id: str, cursor: str | None, limit: int) -> tuple[list[JobMetric], str | None]:
    """In (attempt, step) order, as ``list_metrics``: a point is unique on them."""
    query = select(JobMetric).where(JobMetric.job_id == job_id)
    return fetch_page(session, query, (JobMetric.attempt, JobMetric.step), cursor, limit)


def page_checkpoints(
    session: Session, job_id: str, cursor: str | None, limit: int
) -> tuple[list[Checkpoint], str | None]:
    query = select(Checkpoint).where(Checkpoint.job_id == job_id)
    return fetch_page(session, query, (Checkpoint.step, Checkpoint.id), cursor, limit)


def list_checkpoints(session: Session, job_id: str) -> list[Checkpoint]:
    return list(session.scalars(select(Checkpoint).where(Checkpoint.job_id == job_id).order_by(Checkpoint.step)))


def record_metrics(
    session: Session,
    job: Job,
    attempt: int,
    epoch: int,
    step: int,
    values: dict[str, Any],
    checkpoint_blocked_s: float | None = None,
) -> None:
    """Idempotent: a repeated point (same attempt and step) merges into the one already stored."""
    point = session.scalars(
        select(JobMetric).where(JobMetric.job_id == job.id, JobMetric.attempt == attempt, JobMetric.step == step)
    ).one_or_none()
    if point is None:
        point = JobMetric(job_id=job.id, attempt=attempt, epoch=epoch, step=step, values=dict(values))
        session.add(point)
    else:
        point.values = {**point.values, **values}
    if checkpoint_blocked_s is not None:
        point.checkpoint_blocked_s = checkpoint_blocked_s  # set, not added: a retried point changes nothing
    job.latest_metrics = {**(job.latest_metrics or {}), **values, "epoch": epoch, "step": step}


def record_checkpoint(
    session: Session,
    job: Job,
    attempt: int,
    epoch: int,
    step: int,
    path: str,
    size_bytes: int,
    metrics: dict[str, Any],
) -> None:
    """Idempotent on the checkpoint's path."""
    exists = session.scalars(select(Checkpoint.id).where(Checkpoint.job_id == job.id, Checkpoint.path == path)).first()
    if exists is None:
        session.add(
            Checkpoint(
                job_id=job.id,
                attempt=attempt,
                epoch=epoch,
                step=step,
                path=path,
                size_bytes=size_bytes,
                metrics=dict(metrics),
            )
        )


def delete_checkpoints(session: Session, job_id: str, checkpoint_ids: list[int]) -> int:
    """Forget these checkpoints of the job (their folders are already deleted); returns how many went."""
    if not checkpoint_ids:
        return 0
    result = session.execute(delete(Checkpoint).where(Checkpoint.job_id == job_id, Checkpoint.id.in_(checkpoint_ids)))
    return result.rowcount


def jobs_for_checkpoint_upkeep(
    session: Session, finished_since: datetime | None
) -> list[tuple[str, JobState, str | None]]:
    return runs_for_checkpoint_upkeep(session, Job, finished_since)


def runs_for_checkpoint_upkeep(
    session: Session, model: Any, finished_since: datetime | None
) -> list[tuple[str, JobState, str | None]]:
    """``(id, state, cluster)`` of the runs of ``model`` (jobs, or sweeps: the same lifecycle columns) that ever
    started and are active or finished since ``finished_since`` (every one that ever started when it is None)."""
    query = select(model.id, model.state, model.cluster).where(model.attempt >= 1).order_by(model.created_at, model.id)
    if finished_since is not None:
        query = query.where(or_(model.state.in_(ACTIVE), model.finished_at >= finished_since))
    return [(run_id, state, cluster) for run_id, state, cluster in session.execute(query)]
