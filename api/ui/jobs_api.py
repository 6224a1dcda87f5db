"""The JSON the jobs pages poll (``api.ui.live``: ETags, 304s), signed in by the session cookie. Every route
finds its job in the user's scope first: another project's job is a 404, as in the REST API."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from api.deps import ControlPlaneDep, SessionDep
from api.filters import NamePrefix
from api.ui.auth import UiUserDep
from api.ui.job_views import job_summary
from api.ui.jobs import Cursor, LabelFilter, Limit, StateFilter, job_or_404, list_page
from api.ui.live import AnswerCache, etag_of, json_answer, json_body, not_modified
from orchestrator.errors import NotFound
from orchestrator.repositories import jobs as jobs_repo
from orchestrator.repositories import metric_points
from orchestrator.services.downsample import DEFAULT_POINTS, MAX_POINTS
from orchestrator.services.log_lines import view
from orchestrator.services.logs import read_logs
from orchestrator.services.metric_series import XAxis, charts
from orchestrator.states.jobs import TERMINAL

router = APIRouter(prefix="/api")

CHARTS = AnswerCache()  # downsampled curves by ETag: reading 100,000 points takes a second
MAX_LOG_LINES = 5000  # lines in one answer of the logs route (the download has them all)


@router.get("/jobs")
def jobs_json(
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
    """A page of the jobs list, as the page shows it (the list polls it to update its rows in place)."""
    rows, next_cursor = list_page(session, service, user, state, label, name, cursor, limit)
    return json_answer(request, {"items": rows, "next_cursor": next_cursor})


@router.get("/jobs/{job_id}")
def job_json(request: Request, job_id: str, session: SessionDep, user: UiUserDep) -> Response:
    """The job, every event of its history and its checkpoints (the best marked): what its page polls."""
    job = job_or_404(session, job_id, user)
    summary = job_summary(job, jobs_repo.list_events(session, job.id), jobs_repo.list_checkpoints(session, job.id))
    return json_answer(request, summary)


@router.get("/jobs/{job_id}/metrics")
def job_metrics(
    request: Request,
    job_id: str,
    session: SessionDep,
    user: UiUserDep,
    x: Annotated[XAxis, Query(description="The x-axis: step, epoch (a mean per epoch) or time.")] = "step",
    points: Annotated[int, Query(ge=16, le=MAX_POINTS, description="Points per series at most.")] = DEFAULT_POINTS,
) -> Response:
    """The job's curves, downsampled per series (min and max per bucket), one series per metric and attempt.
    The ETag comes from a count of the points: polling a job whose points did not change reads none of them,
    and an answer already made for that ETag (another viewer's, a reload) is served again."""
    job = job_or_404(session, job_id, user)
    etag = etag_of("metrics", job.id, job.updated_at, metric_points.job_metrics_stamp(session, job.id), x, points)
    unchanged = not_modified(request, etag)
    if unchanged is not None:
        return unchanged
    body = CHARTS.get(etag)
    if body is None:
        body = json_body(charts(metric_points.job_metric_points(session, job.id, with_time=x == "time"), x, points))
        CHARTS.put(etag, body)
    return json_answer(request, None, etag, body)


@router.get("/jobs/{job_id}/logs")
def job_logs(
    request: Request,
    job_id: str,
    service: ControlPlaneDep,
    user: UiUserDep,
    attempt: Annotated[int | None, Query(ge=1, description="Default: the current attempt.")] = None,
    after: Annotated[int | None, Query(ge=0, description="Lines from this line number on (a live tail).")] = None,
    tail: Annotated[int, Query(ge=1, le=MAX_LOG_LINES, description="Without after: the last N lines.")] = 1000,
    q: Annotated[str | None, Query(max_length=200, description="Only lines holding this text (any case).")] = None,
) -> Response:
    """An attempt's lines as the REST logs route serves them (``view``), by line number: the page asks for
    the last lines first, then for what follows the last it has; a search returns the matching lines of the
    whole attempt (at most MAX_LOG_LINES)."""
    with service.sessions() as session:  # released before Ray is asked
        job = job_or_404(session, job_id, user)
    attempt = attempt or job.attempt
    if attempt > max(job.attempt, 1):
        raise NotFound(f"job {job_id} has had {job.attempt} attempt(s), not {attempt}")
    text = view(read_logs(service.backends, service.log_archive, job, attempt), service.settings.log_ray_chatter)
    lines = text.splitlines()
    total = len(lines)
    if q:
        needle = q.lower()
        found = [(n, line) for n, line in enumerate(lines) if needle in line.lower()]
        numbered = found[:MAX_LOG_LINES]
        return json_answer(
            request,
            {"attempt": attempt, "total": total, "q": q, "matches": len(found), "lines": numbered, "next": total},
        )
    # A follow past the end: the log it followed was replaced by a shorter copy (Ray's live copy lost, the
    # archive behind it): start again from the tail, and say so (the page clears what it shows).
    reset = after is not None and after > total
    start = after if after is not None and not reset else max(0, total - tail)
    chunk = lines[start : start + MAX_LOG_LINES]
    return json_answer(
        request,
        {
            "attempt": attempt,
            "total": total,
            "start": start,
            "lines": [(start + i, line) for i, line in enumerate(chunk)],
            "next": start + len(chunk),
            "ended": job.state in TERMINAL,
            "reset": reset,
        },
    )
