"""The jobs pages: the list (server-side paging with the REST list's cursors, filters in the URL) and a
job's page, with its member actions (cancel; deploy a checkpoint)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Form, Query, Request
from fastapi.responses import PlainTextResponse, RedirectResponse, Response

from api.deps import ControlPlaneDep, SessionDep
from api.filters import NamePrefix, label_filters
from api.ui.auth import UiMember, UiUser, UiUserDep
from api.ui.job_views import job_row, job_summary, plan_view
from api.ui.list_query import list_query
from api.ui.templating import render
from orchestrator.db.models import Job, JobState
from orchestrator.errors import NotFound
from orchestrator.repositories import jobs as jobs_repo
from orchestrator.services.downsample import DEFAULT_POINTS
from orchestrator.services.goodput import goodput_of
from orchestrator.services.logs import read_logs
from orchestrator.use_cases.deployments import deploy_checkpoint
from orchestrator.use_cases.jobs import cancel_job
from orchestrator_contract.deployments import SourceSpec

router = APIRouter()

PAGE_SIZES = (25, 50, 100, 200)

StateFilter = Annotated[list[JobState] | None, Query(description="Repeat to match any of several.")]
LabelFilter = Annotated[list[str] | None, Query(description="key=value; repeat to require several.")]
Cursor = Annotated[str | None, Query(max_length=512)]
Limit = Annotated[int, Query(ge=1, le=200)]


def list_page(session, service, user, state, label, name, cursor, limit):
    """One page of the jobs list, the REST list's query (``jobs_repo.list_jobs``) in the user's scope."""
    labels = label_filters(label, service.settings.max_label_filters)
    jobs, next_cursor = jobs_repo.list_jobs(session, user.scope, state, labels, cursor, limit, name)
    return [job_row(job) for job in jobs], next_cursor


@router.get("/jobs")
def jobs_page(
    request: Request,
    session: SessionDep,
    service: ControlPlaneDep,
    user: UiUserDep,
    state: StateFilter = None,
    label: LabelFilter = None,
    name: NamePrefix = None,
    cursor: Cursor = None,
    limit: Limit = 50,
) -> Response:
    rows, next_cursor = list_page(session, service, user, state, label, name, cursor, limit)
    query = list_query(state, limit, label=label, name=name)
    return render(
        request,
        "jobs.html",
        user,
        session=session,
        rows=rows,
        states=list(JobState),
        chosen_states={s.value for s in state or []},
        labels=label or [],
        name=name or "",
        limit=limit,
        page_sizes=PAGE_SIZES,
        first_page=cursor is None,
        next_url=f"/ui/jobs?{list_query(state, limit, next_cursor, label=label, name=name)}" if next_cursor else None,
        first_url=f"/ui/jobs?{query}",
        live_url=f"/ui/api/jobs?{list_query(state, limit, cursor, label=label, name=name)}",
    )


def job_or_404(session, job_id: str, user: UiUser) -> Job:
    """The job if the user's scope holds it; another project's job is simply not found (as in the REST API)."""
    job = jobs_repo.get_job(session, job_id, user.scope)
    if job is None:
        raise NotFound(f"no job {job_id}")
    return job


@router.get("/jobs/{job_id}")
def job_page(request: Request, job_id: str, session: SessionDep, user: UiUserDep) -> Response:
    job = job_or_404(session, job_id, user)
    summary = job_summary(job, jobs_repo.list_events(session, job.id), jobs_repo.list_checkpoints(session, job.id))
    return render(
        request,
        "job.html",
        user,
        session=session,
        job=summary["job"],
        events=summary["events"],
        checkpoints=summary["checkpoints"],
        plan=plan_view(job),
        spec=job.spec,
        attempts=list(range(job.attempt, 0, -1)),
        page={"id": job.id, "attempt": job.attempt, "points": DEFAULT_POINTS, "can_write": user.can_write},
        default_deployment=deployment_name(job),
        goodput=goodput_of(session, job.id),
    )


def deployment_name(job: Job) -> str:
    """A name to offer for a deployment of the job's checkpoint (the Serve application's rules)."""
    base = "".join(c if c.isalnum() else "-" for c in (job.name or "job").lower()).strip("-")[:40] or "job"
    return f"{base}-{job.id[:8].lower()}"


@router.post("/jobs/{job_id}/cancel")
def cancel(request: Request, job_id: str, session: SessionDep, service: ControlPlaneDep, user: UiMember) -> Response:
    """The REST cancel (``cancel_job``): a queued job ends at once, a running one goes CANCELLING."""
    cancel_job(session, service.backends, user.scope, job_id)  # AlreadyFinished: 409
    return RedirectResponse(f"/ui/jobs/{job_id}", status_code=303)


@router.post("/jobs/{job_id}/checkpoints/{checkpoint_id}/deploy")
def deploy_job_checkpoint(
    job_id: str,
    checkpoint_id: int,
    session: SessionDep,
    service: ControlPlaneDep,
    user: UiMember,
    name: Annotated[str, Form(max_length=63)],
) -> Response:
    """A deployment of exactly this checkpoint, made as ``POST /v1/deployments`` makes one (one use-case:
    ``deploy_checkpoint``), in the job's project."""
    source = SourceSpec(checkpoint_id=checkpoint_id)
    deployment = deploy_checkpoint(session, service.settings, service.backends, user.scope, name, source, job_id=job_id)
    session.commit()
    return RedirectResponse(f"/ui/deployments/{deployment.name}", status_code=303)


@router.get("/jobs/{job_id}/logs/download")
def download_logs(
    job_id: str,
    service: ControlPlaneDep,
    user: UiUserDep,
    attempt: Annotated[int | None, Query(ge=1)] = None,
) -> Response:
    """An attempt's whole output, as stored (terminal escape codes removed, nothing else left out)."""
    with service.sessions() as session:  # released before Ray is asked
        job = job_or_404(session, job_id, user)
    attempt = attempt or job.attempt
    if attempt > max(job.attempt, 1):
        raise NotFound(f"job {job_id} has had {job.attempt} attempt(s), not {attempt}")
    text = read_logs(service.backends, service.log_archive, job, attempt)
    filename = f"{job.id}-attempt-{attempt}.log"
    return PlainTextResponse(text, headers={"Content-Disposition": f'attachment; filename="{filename}"'})
