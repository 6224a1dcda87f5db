"""The jobs pages: the list (server-side paging with the REST list's cursors, filters in the URL) and a
job's page, with its member actions (cancel; deploy a checkpoint)."""

from __future__ import annotations

from typing import Annotated
from urllib.parse import urlencode

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from api.deps import ControlPlaneDep, SessionDep
from api.filters import NamePrefix, label_filters
from api.ui.auth import UiUserDep
from api.ui.job_views import job_row
from api.ui.templating import render
from orchestrator.db.models import JobState
from orchestrator.repositories import jobs as jobs_repo

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


def filter_query(state, label, name, limit, cursor=None) -> str:
    """The filters as a query string: links to the next page and the live JSON keep them."""
    params: list[tuple[str, str]] = [("state", s.value) for s in state or []]
    params += [("label", item) for item in label or []]
    if name:
        params.append(("name", name))
    if limit != 50:
        params.append(("limit", str(limit)))
    if cursor:
        params.append(("cursor", cursor))
    return urlencode(params)


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
    query = filter_query(state, label, name, limit)
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
        next_url=f"/ui/jobs?{filter_query(state, label, name, limit, next_cursor)}" if next_cursor else None,
        first_url=f"/ui/jobs?{query}",
        live_url=f"/ui/api/jobs?{filter_query(state, label, name, limit, cursor)}",
    )
