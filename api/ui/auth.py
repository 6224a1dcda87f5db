"""Who is signed in to the dashboard, and what they may do: the request dependencies of every /ui route.

- ``UiUserDep``: the signed-in user (a page without one redirects to the sign-in page; a JSON route answers 401).
  The key is checked on every request as the REST API checks a bearer key (``api.deps``): revoked or expired,
  the session ends.
- ``CsrfUser``: the same, for a POST: the session's CSRF token must come in the form field ``csrf_token`` or the
  ``X-CSRF-Token`` header, else 403.
- ``UiMember``: ``CsrfUser`` with a key that may write (member or admin): a viewer's POST is 403.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from api.deps import ControlPlaneDep, principal_for_key_id
from api.ui.secret import ui_secret
from api.ui.session import ENV_KEY, SESSION_COOKIE, Signer, UiSession
from orchestrator.auth import Principal
from orchestrator.control_plane import ControlPlane
from orchestrator.db.models import Role
from orchestrator.errors import Forbidden, Unauthorized

CSRF_FIELD = "csrf_token"
CSRF_HEADER = "X-CSRF-Token"


class LoginRequired(Exception):
    """No valid session: pages redirect to the sign-in page, JSON routes answer 401 (``api.ui.mount``)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True)
class UiUser:
    principal: Principal
    session: UiSession

    @property
    def scope(self) -> str | None:
        """The project every query is confined to: the key's own; a cluster-wide admin's chosen one, or None
        (every project)."""
        if self.principal.is_cluster_admin:
            return self.session.project
        return self.principal.project_id

    @property
    def can_write(self) -> bool:
        return self.principal.can_write

    @property
    def is_cluster_admin(self) -> bool:
        return self.principal.is_cluster_admin

    @property
    def csrf(self) -> str:
        return self.session.csrf

    @property
    def role(self) -> str:
        return "cluster admin" if self.is_cluster_admin else str(Role(self.principal.role).value)


def signer(request: Request) -> Signer:
    """The app's one signer, made on first use (the secret may be a file under var_dir)."""
    state = request.app.state
    if getattr(state, "ui_signer", None) is None:
        settings = state.service.settings
        state.ui_signer = Signer(ui_secret(settings), settings.ui_session_hours * 3600)
    return state.ui_signer


SignerDep = Annotated[Signer, Depends(signer)]


def principal_of(service: ControlPlane, session: UiSession, sign: Signer) -> Principal:
    """The key a session names, checked now; LoginRequired when it is gone, expired or rotated away."""
    if session.key_id == ENV_KEY:
        if not any(hmac.compare_digest(session.token_mac, sign.token_mac(t)) for t in service.settings.admin_tokens):
            raise LoginRequired("the admin token this session signed in with is no longer configured")
        return Principal(Role.ADMIN, project_id=None, cluster_wide=True)
    try:
        return principal_for_key_id(service, session.key_id)
    except Unauthorized as error:
        raise LoginRequired(str(error)) from None


def ui_user(request: Request, service: ControlPlaneDep, sign: SignerDep) -> UiUser:
    session = sign.loads(request.cookies.get(SESSION_COOKIE))
    if session is None:
        raise LoginRequired("sign in with an API key")
    user = UiUser(principal_of(service, session, sign), session)
    request.state.ui_user = user  # for the error pages
    return user


UiUserDep = Annotated[UiUser, Depends(ui_user)]


async def csrf_user(request: Request, user: UiUserDep) -> UiUser:
    """Every state-changing /ui route depends on this (directly or through ``UiMember``)."""
    token = request.headers.get(CSRF_HEADER)
    if token is None:
        form = await request.form()  # parsed once: the route reads the same form
        value = form.get(CSRF_FIELD)
        token = value if isinstance(value, str) else None
    if not token or not hmac.compare_digest(token.encode(), user.csrf.encode()):
        raise Forbidden(
            f"missing or wrong CSRF token (the form field {CSRF_FIELD} or the {CSRF_HEADER} header): reload the page"
        )
    return user


CsrfUser = Annotated[UiUser, Depends(csrf_user)]


def ui_member(user: CsrfUser) -> UiUser:
    if not user.can_write:
        raise Forbidden(f"a {user.principal.role} key is read-only")
    return user


UiMember = Annotated[UiUser, Depends(ui_member)]
