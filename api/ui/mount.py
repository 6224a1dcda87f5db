"""``install_ui(app)``: the dashboard's routers under /ui, its static files at /ui/static, and its error
answers (a page without a session redirects to the sign-in page; an error on a page is an HTML page with the
same status the REST API would give; /ui/api answers JSON like the REST API).

A new page module adds its router to ``PAGE_ROUTERS`` (one line)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles

from api.errors import error_response, status_of
from api.ui import cluster, deployments, jobs, jobs_api, login, sweeps
from api.ui.auth import LoginRequired
from api.ui.session import SESSION_COOKIE, clear_cookie
from api.ui.templating import render
from orchestrator.errors import DomainError

PREFIX = "/ui"
API_PREFIX = "/ui/api/"
STATIC = Path(__file__).parent / "static"

PAGE_ROUTERS: list[APIRouter] = [
    login.router,
    jobs.router,
    jobs_api.router,
    sweeps.router,
    sweeps.api_router,
    deployments.router,
    deployments.api_router,
    cluster.router,
    cluster.api_router,
]


def install_ui(app: FastAPI) -> None:
    """Call after ``install_error_handler``: the DomainError handler here answers /ui pages with HTML and
    hands every other path to the REST API's JSON answer."""
    for router in PAGE_ROUTERS:  # not in the OpenAPI schema: the REST API's contract is /v1
        app.include_router(router, prefix=PREFIX, include_in_schema=False)
    app.mount(f"{PREFIX}/static", StaticFiles(directory=STATIC), name="ui-static")

    async def login_required(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, LoginRequired)
        if request.url.path.startswith(API_PREFIX):
            return JSONResponse({"detail": exc.message}, status_code=401)
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        if request.method != "GET":
            target = "/ui/jobs"
        response = RedirectResponse(f"/ui/login?next={quote(target)}", status_code=303)
        clear_cookie(response, request, SESSION_COOKIE)
        return response

    async def domain_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, DomainError)
        path = request.url.path
        if not path.startswith(PREFIX + "/") or path.startswith(API_PREFIX):
            return error_response(exc)
        status = status_of(exc)
        user = getattr(request.state, "ui_user", None)
        return render(request, "error.html", user, status, status=status, message=str(exc))

    app.add_exception_handler(LoginRequired, login_required)
    app.add_exception_handler(DomainError, domain_error)
