"""Authentication before validation, for a body FastAPI cannot parse too.

FastAPI parses a JSON body before it runs any of the route's dependencies, the key check among them, and
answers a malformed one with a 422 there and then: an unauthenticated caller got a 422 where a well-formed body
gets a 401. Here every validation error of a route that needs a caller is answered only once the caller passed
that check: else the answer is the check's own (401 for no key or an unknown one, the sign-in answer for no
dashboard session). Only authentication: a caller who is known but may not do this still gets the 422.
``tests/security/test_every_route_needs_a_key.py`` checks it on every route.
"""

from __future__ import annotations

from collections.abc import Iterator

from fastapi import FastAPI, Request
from fastapi.exception_handlers import request_validation_exception_handler
from fastapi.exceptions import RequestValidationError
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from api.deps import bearer_scheme, current_principal
from api.run_auth import RunCaller
from api.ui.auth import LoginRequired, signer, ui_user
from orchestrator.errors import Unauthorized


def _calls(dependant) -> Iterator[object]:
    yield dependant.call
    for sub in dependant.dependencies:
        yield from _calls(sub)


async def authenticate(request: Request) -> None:
    """The check of the caller that the request's route runs as a dependency: raises its error, if any."""
    route = request.scope.get("route")
    dependant = getattr(route, "dependant", None)
    calls = set(_calls(dependant)) if dependant is not None else set()
    service = request.app.state.service
    if ui_user in calls:  # a dashboard session (a database read: in a thread, as FastAPI runs it)
        await run_in_threadpool(ui_user, request, service, signer(request))
    elif current_principal in calls:  # an API key
        await current_principal(await bearer_scheme(request), service)
    elif bearer_scheme in calls:  # a run's token or claim code (/internal): its route's RunCaller checks it
        credentials = await bearer_scheme(request)
        if credentials is None:
            raise Unauthorized("missing 'Authorization: Bearer <token>' header")
        for caller in calls:
            if isinstance(caller, RunCaller):
                await run_in_threadpool(caller.authenticate, service, request.path_params, credentials)


async def _validation_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    try:
        await authenticate(request)
    except (Unauthorized, LoginRequired) as refused:  # answered as the route's own dependency would be
        handler = next(
            request.app.exception_handlers[k] for k in type(refused).__mro__ if k in request.app.exception_handlers
        )
        return await handler(request, refused)
    return await request_validation_exception_handler(request, exc)


def install_auth_first(app: FastAPI) -> None:
    """Call after the error handlers (``install_error_handler``, ``install_ui``): a refused caller is answered
    by theirs."""
    app.add_exception_handler(RequestValidationError, _validation_error)
