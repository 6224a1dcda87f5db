"""Rendering a dashboard page: the Jinja2 environment (autoescaped) and what every page's template gets."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates

from api.ui.auth import CSRF_FIELD, CSRF_HEADER, UiUser
from orchestrator.repositories import projects as projects_repo

TEMPLATES = Jinja2Templates(directory=str(Path(__file__).parent / "templates"))

# The pages load only the service's own scripts and styles (nothing inline, nothing from elsewhere).
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def _when(value: datetime | None) -> str:
    if value is None:
        return ""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def _state_class(state: Any) -> str:
    return "state-" + str(getattr(state, "value", state)).lower()


TEMPLATES.env.filters["when"] = _when
TEMPLATES.env.filters["state_class"] = _state_class


def render(
    request: Request, template: str, user: UiUser | None, status_code: int = 200, session=None, **context: Any
) -> HTMLResponse:
    """``template`` with ``context`` and, for a signed-in ``user``, the user, the CSRF token (the forms' hidden
    field, and a meta tag the scripts send as a header) and, for a cluster-wide admin, the projects to switch
    between (``session``: a database session to list them with)."""
    projects = []
    if user is not None and user.is_cluster_admin and session is not None:
        projects = [(p.id, p.name) for p in projects_repo.list_projects(session)]
    response = TEMPLATES.TemplateResponse(
        request,
        template,
        {
            "user": user,
            "csrf_field": CSRF_FIELD,
            "csrf_header": CSRF_HEADER,
            "csrf_token": user.csrf if user else "",
            "projects": projects,
            "path": request.url.path,
            **context,
        },
        status_code=status_code,
    )
    response.headers.update(SECURITY_HEADERS)
    return response
