from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response, status
from fastapi.responses import PlainTextResponse, StreamingResponse

from api.deps import ControlPlaneDep, CurrentKey, IdempotencyKey, SessionDep, WriterKey, answer_created
from api.filters import NamePrefix, label_filters
from api.paging import JobsPage, MetricsPage, Page
from orchestrator.auth import Principal
from orchestrator.db.models import Job, JobState
from orchestrator.errors import Invalid, NotFound
from orchestrator.repositories import jobs as jobs_repo
from orchestrator.services.goodput import goodput_of
from orchestrator.services.log_lines import view
from orchestrator.services.logs import last_lines, read_logs
from orchestrator.use_cases.jobs import cancel_job, submit_job
from orchestrator_contract.jobs import JobSpec
from orchestrator_contract.rest import CheckpointOut, GoodputOut, JobEventOut, JobOut, JobPage, MetricOut, Paged

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])


def _job_or_404(session, job_id: str, principal: Principal) -> Job:
    job = jobs_repo.get_job(session, job_id, principal.project_scope())
    if job is None:
        raise NotFound(f"no job {job_id}")
    return job


@router.post("", status_code=status.HTTP_201_CREATED, summary="Submit a training job")
def create_job(
    spec: JobSpec,
    session: SessionDep,
    service: ControlPlaneDep,
    principal: WriterKey,
    response: Response,
    idempotency_key: IdempotencyKey = None,
    project_id: Annotated[str | None, Query(description="Cluster-wide admins only: the project to run in.")] = None,
) -> JobOut:
    """Validate the spec, plan it (strategy, global batch, scaled learning rate) and queue the job (201). It is
    refused (422, naming the field) when it can never run on this cluster. A repeated `Idempotency-Key`
    returns the job the first request made (200, `Idempotent-Replayed: true`); the same key with another
    spec is 409."""
    job, created = submit_job(session, service.settings, service.backends, principal, spec, project_id, idempotency_key)
    session.commit()
    if created:  # admitted now if it fits, not at the scheduler's next tick
        service.wake_scheduler()
    answer_created(response, created)
    return JobOut.model_validate(job)


@router.get("", summary="List jobs")
def list_jobs(
    session: SessionDep,
    service: ControlPlaneDep,
    principal: CurrentKey,
    page: JobsPage,
    state: Annotated[list[JobState] | None, Query(description="Repeat to match any of several.")] = None,
    label: Annotated[
        list[str] | None, Query(description="key=value; repeat to require several (ORCHESTRATOR_MAX_LABEL_FILTERS).")
    ] = None,
    name_prefix: NamePrefix = None,
) -> JobPage:
    """Newest first, filtered by state, labels and the start of the name; the next page's cursor is in the
    body (`next_cursor`) and in the X-Next-Cursor header. 50 a page unless `limit` says otherwise."""
    labels = label_filters(label, service.settings.max_label_filters)
    scope = principal.project_scope()
    jobs = page.fetch(
        lambda cursor, limit: jobs_repo.list_jobs(session, scope, state, labels, cursor, limit, name_prefix)
    )
    return JobPage(
        items=[JobOut.model_validate(j) for j in jobs], next_cursor=page.response.headers.get("X-Next-Cursor")
    )


@router.get("/{job_id}", summary="Get a job")
def get_job(job_id: str, session: SessionDep, principal: CurrentKey) -> JobOut:
    """Its state and why (reason, message), attempt, plan, latest metrics and result."""
    return JobOut.model_validate(_job_or_404(session, job_id, principal))


@router.post("/{job_id}/cancel", summary="Cancel a job")
def cancel(job_id: str, session: SessionDep, service: ControlPlaneDep, principal: WriterKey) -> JobOut:
    """A queued job ends CANCELLED at once; a running one goes CANCELLING while Ray stops it, then CANCELLED.
    A job that already ended is 409."""
    job = cancel_job(session, service.backends, principal.project_scope(), job_id)  # AlreadyFinished: 409
    return JobOut.model_validate(job)


@router.get("/{job_id}/events", summary="A job's state history")
def events(
    job_id: str, session: SessionDep, principal: CurrentKey, page: Page
) -> list[JobEventOut] | Paged[JobEventOut]:
    """Oldest first; paged (X-Next-Cursor)."""
    _job_or_404(session, job_id, principal)
    return page.answer(
        [JobEventOut.model_validate(e) for e in page.fetch(lambda c, n: jobs_repo.page_events(session, job_id, c, n))]
    )


@router.get("/{job_id}/metrics", summary="A job's metrics")
def metrics(
    job_id: str, session: SessionDep, principal: CurrentKey, page: MetricsPage
) -> list[MetricOut] | Paged[MetricOut]:
    """By attempt, then step; paged (X-Next-Cursor)."""
    _job_or_404(session, job_id, principal)
    return page.answer(
        [MetricOut.model_validate(m) for m in page.fetch(lambda c, n: jobs_repo.page_metrics(session, job_id, c, n))]
    )


@router.get("/{job_id}/goodput", summary="A job's goodput: kept training time over held time, and the rest by cause")
def goodput(job_id: str, session: SessionDep, principal: CurrentKey) -> GoodputOut:
    """From its state history, its checkpoints and when its reports arrived (docs/jobs.md "Goodput"); an active
    job's counts up to now."""
    _job_or_404(session, job_id, principal)
    return goodput_of(session, job_id)


@router.get("/{job_id}/checkpoints", summary="A job's checkpoints")
def checkpoints(
    job_id: str, session: SessionDep, principal: CurrentKey, page: Page
) -> list[CheckpointOut] | Paged[CheckpointOut]:
    """By step; paged (X-Next-Cursor)."""
    _job_or_404(session, job_id, principal)
    rows = page.fetch(lambda c, n: jobs_repo.page_checkpoints(session, job_id, c, n))
    return page.answer([CheckpointOut.model_validate(c) for c in rows])


@router.get("/{job_id}/logs", response_class=PlainTextResponse, summary="A job's output (or follow it)")
def logs(
    job_id: str,
    service: ControlPlaneDep,
    principal: CurrentKey,
    follow: bool = False,
    attempt: Annotated[
        int | None, Query(ge=1, description="An earlier attempt's output (default: the current one).")
    ] = None,
    tail: Annotated[
        int | None, Query(ge=0, le=1_000_000, description="Only the last N lines (a follow: to start with).")
    ] = None,
    rank: Annotated[
        int | None,
        Query(
            ge=0,
            le=100_000,
            description="Only this rank's lines: a training worker's, known by the line it prints first "
            "('[rank N/W] training worker started (pid P, ...)'). Driver lines belong to no rank.",
        ),
    ] = None,
):
    """Driver and worker output of an attempt, from Ray while it has it, else from durable storage, without
    terminal escape codes and without Ray Train's per-report and per-checkpoint lines (unless
    ORCHESTRATOR_LOG_RAY_CHATTER); `?rank=N` keeps rank N's lines only, `tail` counts what is left.
    `?follow=true` streams the current attempt's until the job ends, sending only what is new, line by line
    (at most ORCHESTRATOR_MAX_LOG_FOLLOWS_PER_KEY follows per key at once: 429 past it)."""
    with service.sessions() as session:  # released before Ray is asked or the stream starts
        job = _job_or_404(session, job_id, principal)
    if attempt is not None and attempt > job.attempt:
        raise NotFound(f"job {job_id} has had {job.attempt} attempt(s), not {attempt}")
    if follow:
        if attempt is not None:
            raise Invalid("follow streams the current attempt: drop attempt")
        key = principal.key_id or "environment-admin"
        stream = service.log_follows.start(job.id, key, tail, rank)  # 429 past the cap
        return StreamingResponse(stream, media_type="text/plain")
    text = view(read_logs(service.backends, service.log_archive, job, attempt), service.settings.log_ray_chatter, rank)
    return PlainTextResponse(last_lines(text, tail))
