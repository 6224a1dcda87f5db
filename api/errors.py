"""The one mapping from the domain's errors (``orchestrator.errors``) to HTTP: a status per kind, and the
body in the contract's error shapes (``orchestrator_contract.rest.errors``). Routers raise domain errors; no
router builds an error response itself. The same table documents the statuses in the OpenAPI schema."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from orchestrator.errors import (
    Conflict,
    DomainError,
    Forbidden,
    Invalid,
    NotFound,
    Refused,
    TooLarge,
    TooMany,
    Unauthorized,
)
from orchestrator_contract.rest import ErrorMessage, FieldError, FieldErrors

# kind -> (status, what the status means in this API: the OpenAPI description of the response)
ERRORS: dict[type[DomainError], tuple[int, str]] = {
    Refused: (400, "Refused (e.g. an event no honest driver sends)"),
    Unauthorized: (401, "No key, or an unknown, revoked or expired one"),
    Forbidden: (403, "The key's role may not do this"),
    NotFound: (404, "Not found (or not in the key's project)"),
    Conflict: (409, "Conflicts with the object's state or a taken name"),
    TooLarge: (413, "Over a size cap (the message names the setting)"),
    Invalid: (422, "Refused as given: the field (a list of field errors) or the reason (a message)"),
    TooMany: (429, "Over a per-key limit; see Retry-After"),
}
# Answered outside the domain: the body-size middleware (api/body_size.py).
BODY_TOO_LARGE = (413, "The request body is over its cap")


def status_of(exc: DomainError) -> int:
    for kind in type(exc).__mro__:
        if kind in ERRORS:
            return ERRORS[kind][0]
    return 400  # a DomainError of no kind listed: the caller's to fix, whatever it is


def error_response(exc: DomainError) -> JSONResponse:
    headers = {}
    if isinstance(exc, Unauthorized):
        headers["WWW-Authenticate"] = "Bearer"
    if isinstance(exc, TooMany) and exc.retry_after_s is not None:
        headers["Retry-After"] = str(exc.retry_after_s)
    if isinstance(exc, Invalid) and exc.loc is not None:
        # The shape of FastAPI's own validation errors, so clients handle one format.
        body = FieldErrors(detail=[FieldError(loc=["body", *exc.loc], msg=str(exc), type="value_error")])
    else:
        body = ErrorMessage(detail=str(exc))
    return JSONResponse(body.model_dump(), status_code=status_of(exc), headers=headers or None)


def install_error_handler(app: FastAPI) -> None:
    async def handle(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, DomainError)
        return error_response(exc)

    app.add_exception_handler(DomainError, handle)
