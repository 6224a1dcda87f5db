"""The dashboard's session: a cookie signed with the server secret (itsdangerous, HMAC-SHA1 over a
timestamped payload), HttpOnly, SameSite=Strict, Secure over https. It names the API key by id, never the
key itself; the key is looked up on every request, so revoking it (or its expiry) ends the session.

The environment's admin token has no id: its session holds an HMAC of the token under the server secret,
so rotating the token away ends it too, and the cookie reveals nothing of the token.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass, replace

from fastapi import Request, Response
from itsdangerous import BadSignature, SignatureExpired, URLSafeTimedSerializer

SESSION_COOKIE = "orch_ui"
LOGIN_COOKIE = "orch_ui_login"  # the sign-in form's CSRF token, before there is a session
LOGIN_FORM_S = 3600
ENV_KEY = "env"  # the key id of a session signed in with ORCHESTRATOR_ADMIN_TOKEN


@dataclass(frozen=True)
class UiSession:
    key_id: str  # an API key's id, or ENV_KEY
    csrf: str  # this session's CSRF token
    token_mac: str = ""  # ENV_KEY only: HMAC of the admin token it signed in with
    project: str | None = None  # a cluster-wide admin's chosen project (None: every project)

    def with_project(self, project: str | None) -> UiSession:
        return replace(self, project=project)


class Signer:
    """Signs and checks the session and sign-in cookies with one server secret."""

    def __init__(self, secret: str, max_age_s: float) -> None:
        self._secret = secret.encode()
        self.max_age_s = int(max_age_s)
        self._session = URLSafeTimedSerializer(secret, salt="orchestrator.ui.session")
        self._login = URLSafeTimedSerializer(secret, salt="orchestrator.ui.login")

    def token_mac(self, token: str) -> str:
        return hmac.new(self._secret, token.encode(), hashlib.sha256).hexdigest()

    def dumps(self, session: UiSession) -> str:
        return self._session.dumps(
            {"k": session.key_id, "c": session.csrf, "m": session.token_mac, "p": session.project}
        )

    def loads(self, cookie: str | None) -> UiSession | None:
        """The session a cookie holds; None if it is missing, tampered with, signed with another secret or
        older than the session lifetime."""
        if not cookie:
            return None
        try:
            data = self._session.loads(cookie, max_age=self.max_age_s)
        except (BadSignature, SignatureExpired):
            return None
        try:
            return UiSession(key_id=str(data["k"]), csrf=str(data["c"]), token_mac=str(data["m"]), project=data["p"])
        except (KeyError, TypeError):
            return None

    def login_token(self) -> tuple[str, str]:
        """A fresh sign-in form token and its signed cookie."""
        token = secrets.token_urlsafe(24)
        return token, self._login.dumps(token)

    def login_token_ok(self, cookie: str | None, token: str) -> bool:
        if not cookie or not token:
            return False
        try:
            expected = self._login.loads(cookie, max_age=LOGIN_FORM_S)
        except (BadSignature, SignatureExpired):
            return False
        return isinstance(expected, str) and hmac.compare_digest(expected.encode(), token.encode())


def new_session(key_id: str, token_mac: str = "") -> UiSession:
    return UiSession(key_id=key_id, csrf=secrets.token_urlsafe(32), token_mac=token_mac)


def is_https(request: Request) -> bool:
    """Served over https: the request's scheme (uvicorn sets it from X-Forwarded-Proto behind a trusted proxy),
    or an https ORCHESTRATOR_PUBLIC_URL (a proxy that terminates TLS and says nothing)."""
    public_url = request.app.state.service.settings.control_plane_url
    return request.url.scheme == "https" or public_url.startswith("https://")


def set_cookie(response: Response, request: Request, name: str, value: str, max_age_s: int) -> None:
    response.set_cookie(
        name, value, max_age=max_age_s, path="/ui", httponly=True, samesite="strict", secure=is_https(request)
    )


def clear_cookie(response: Response, request: Request, name: str) -> None:
    response.delete_cookie(name, path="/ui", httponly=True, samesite="strict", secure=is_https(request))
