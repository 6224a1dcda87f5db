"""Who may call a run's ``/internal`` routes: that run's own token, or, to claim the token, its attempt's claim code.

``RunCaller`` is the routes' dependency that checks it. As a dependency it runs before FastAPI validates the
route's own parameters and body (FastAPI solves a route's dependencies first), so a request without the run's
credential is a 401 whatever else is wrong with it, never a 422 that describes the route (docs/security.md). A body FastAPI
cannot even parse is refused before any dependency runs: ``api.auth_first`` then calls ``RunCaller.authenticate``,
the same check, before it lets the 422 out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from fastapi import Request
from fastapi.security import HTTPAuthorizationCredentials
from sqlalchemy.orm import Session

from api.deps import BearerDep, SessionDep
from orchestrator.auth import hash_secret, secrets_equal
from orchestrator.control_plane import ControlPlane
from orchestrator.db.models import Job, Sweep
from orchestrator.errors import Unauthorized
from orchestrator.services import run_claims
from orchestrator.states.core import lock_row

Run = Job | Sweep


def check_token(run: Run | None, credentials: HTTPAuthorizationCredentials | None) -> Run:
    """``run``, if the credentials are its token; else 401, the same answer for an unknown run and a wrong token:
    a token says nothing about other runs."""
    if (
        run is None
        or credentials is None
        or not run.token_hash
        or not secrets_equal(hash_secret(credentials.credentials), run.token_hash)
    ):
        raise Unauthorized("not this run's token")
    return run


@dataclass(frozen=True)
class RunCaller:
    """The run named by the path parameter ``param``, loaded (``lock``: locked for the request's transaction)
    if the request bears its credential: the run's token, or with ``claim`` its current claim code."""

    kind: str  # "job" | "sweep"
    model: type
    param: str
    lock: bool = False
    claim: bool = False

    def __call__(self, request: Request, session: SessionDep, credentials: BearerDep) -> Run:
        run_id = request.path_params[self.param]
        run = lock_row(session, self.model, run_id) if self.lock else session.get(self.model, run_id)
        return self.check(run, credentials)

    def check(self, run: Run | None, credentials: HTTPAuthorizationCredentials | None) -> Run:
        if self.claim:
            return run_claims.check_code(self.kind, run, credentials.credentials if credentials else None)
        return check_token(run, credentials)

    def authenticate(
        self, service: ControlPlane, path_params: Mapping[str, str], credentials: HTTPAuthorizationCredentials | None
    ) -> None:
        """The same check outside a route (``api.auth_first``): Unauthorized unless the credential is right."""
        session: Session
        with service.sessions() as session:
            self.check(session.get(self.model, path_params.get(self.param, "")), credentials)
