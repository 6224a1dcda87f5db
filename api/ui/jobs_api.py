"""The JSON the jobs pages poll (``api.ui.live``: ETags, 304s), signed in by the session cookie. Every route
finds its job in the user's scope first: another project's job is a 404, as in the REST API."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from api.deps import ControlPlaneDep, SessionDep
from api.filters import NamePrefix
from api.ui.auth import UiUserDep
from api.ui.jobs import Cursor, LabelFilter, Limit, StateFilter, list_page
from api.ui.live import json_answer

router = APIRouter(prefix="/api")


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
