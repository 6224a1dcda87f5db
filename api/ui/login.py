"""Sign-in with an API key, sign-out, and the cluster-wide admin's project switcher."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import RedirectResponse, Response

from api.deps import ControlPlaneDep, SessionDep, principal_for_secret
from api.ui.auth import CSRF_FIELD, CsrfUser, LoginRequired, SignerDep, principal_of
from api.ui.session import ENV_KEY, LOGIN_COOKIE, LOGIN_FORM_S, SESSION_COOKIE, clear_cookie, new_session, set_cookie
from api.ui.templating import render
from orchestrator.errors import Forbidden, Unauthorized
from orchestrator.use_cases.projects import visible_project

router = APIRouter()

HOME = "/ui/jobs"
MAX_KEY_CHARS = 512


def safe_next(target: str | None) -> str:
    """Where to go after signing in: a dashboard path only (no other site: ``//host`` or a scheme)."""
    if target and target.startswith("/ui/") and not target.startswith("//") and "\\" not in target:
        return target
    return HOME


def _login_page(request: Request, sign, next_url: str, error: str = "", status_code: int = 200) -> Response:
    token, cookie = sign.login_token()
    response = render(request, "login.html", None, status_code, login_token=token, next=next_url, error=error)
    set_cookie(response, request, LOGIN_COOKIE, cookie, LOGIN_FORM_S)
    return response


@router.get("", include_in_schema=False)
def home() -> RedirectResponse:
    return RedirectResponse(HOME, status_code=303)


@router.get("/login")
def login_form(request: Request, service: ControlPlaneDep, sign: SignerDep, next: str | None = None) -> Response:
    session = sign.loads(request.cookies.get(SESSION_COOKIE))
    if session is not None:
        try:
            principal_of(service, session, sign)
            return RedirectResponse(safe_next(next), status_code=303)
        except LoginRequired:
            pass
    return _login_page(request, sign, safe_next(next))


@router.post("/login")
def login(
    request: Request,
    service: ControlPlaneDep,
    sign: SignerDep,
    api_key: Annotated[str, Form(max_length=MAX_KEY_CHARS)] = "",
    csrf_token: Annotated[str, Form(alias=CSRF_FIELD, max_length=256)] = "",
    next: Annotated[str, Form(max_length=2048)] = HOME,
) -> Response:
    if not sign.login_token_ok(request.cookies.get(LOGIN_COOKIE), csrf_token):
        # No form of ours (another site's, or one older than an hour): a fresh form, nothing signed in.
        return _login_page(request, sign, safe_next(next), "The sign-in form expired: try again.", 403)
    key = api_key.strip()
    if not key:
        return _login_page(request, sign, safe_next(next), "Paste an API key.", 422)
    try:
        principal = principal_for_secret(service, key)  # exactly the REST API's check of a bearer key
    except Unauthorized as error:
        return _login_page(request, sign, safe_next(next), f"Not signed in: {error}.", 401)
    if principal.key_id is None:  # the environment's admin token
        session = new_session(ENV_KEY, sign.token_mac(key))
    else:
        session = new_session(principal.key_id)
    response = RedirectResponse(safe_next(next), status_code=303)
    set_cookie(response, request, SESSION_COOKIE, sign.dumps(session), sign.max_age_s)
    clear_cookie(response, request, LOGIN_COOKIE)
    return response


@router.post("/logout")
def logout(request: Request, user: CsrfUser) -> Response:
    response = RedirectResponse("/ui/login", status_code=303)
    clear_cookie(response, request, SESSION_COOKIE)
    return response


@router.post("/project")
def switch_project(
    request: Request,
    user: CsrfUser,
    session: SessionDep,
    sign: SignerDep,
    project_id: Annotated[str, Form(max_length=64)] = "",
    next: Annotated[str, Form(max_length=2048)] = HOME,
) -> Response:
    """A cluster-wide admin's project: every page then shows that project's objects only ('' = every project)."""
    if not user.is_cluster_admin:
        raise Forbidden("only a cluster-wide admin switches projects; a project's key sees its own")
    project = visible_project(session, user.principal, project_id) if project_id else None  # unknown: 404
    response = RedirectResponse(safe_next(next), status_code=303)
    set_cookie(response, request, SESSION_COOKIE, sign.dumps(user.session.with_project(project)), sign.max_age_s)
    return response
