"""One exception hierarchy for everything the SDK raises about the service: built from the server's answer
(its status, its ``detail`` in either of the contract's error shapes, its ``X-Request-ID``), or from no answer
at all (``ConnectionFailed``), or from a wait that ran out of time (``WaitTimeout``)."""

from __future__ import annotations

from typing import Any

import httpx

from orchestrator_contract.rest import FieldError

REQUEST_ID_HEADER = "X-Request-ID"


class OrchestratorError(Exception):
    """Something the service answered (or did not): ``status_code`` (None without an answer), the server's
    ``detail`` (a message, or FastAPI's list of field errors), the ``request_id`` to quote to an operator."""

    def __init__(
        self,
        message: str,
        *,
        status_code: int | None = None,
        detail: str | list | None = None,
        request_id: str | None = None,
        method: str | None = None,
        url: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.detail = detail
        self.request_id = request_id
        self.method = method
        self.url = url

    def __str__(self) -> str:
        where = " ".join(str(part) for part in (self.status_code, self.method, self.url) if part is not None)
        text = f"{where}: {self.message}" if where else self.message
        return f"{text} (request id {self.request_id})" if self.request_id else text


class ConnectionFailed(OrchestratorError):
    """No answer: connection refused, DNS, a timeout (after the retries an idempotent call gets)."""


class AuthError(OrchestratorError):
    """401 or 403."""


class Unauthenticated(AuthError):
    """401: no key, or an unknown, revoked or expired one."""


class PermissionDenied(AuthError):
    """403: the key's role may not do this."""


class NotFound(OrchestratorError):
    """404 (another project's object answers 404 too)."""


class Conflict(OrchestratorError):
    """409: conflicts with the object's state or a taken name (or, client-side, an ambiguous name prefix)."""

    def __init__(self, message: str, *, candidates: list[str] | None = None, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.candidates = candidates or []


class ValidationFailed(OrchestratorError):
    """422: ``field_errors`` keeps the server's field errors (loc, msg, type); empty when detail is a message."""

    @property
    def field_errors(self) -> list[FieldError]:
        if not isinstance(self.detail, list):
            return []
        return [FieldError.model_validate(item) for item in self.detail if isinstance(item, dict)]


class RateLimited(OrchestratorError):
    """429: over a per-key limit; ``retry_after`` (seconds, from Retry-After) when the server said."""

    def __init__(self, message: str, *, retry_after: float | None = None, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.retry_after = retry_after


class ServerError(OrchestratorError):
    """5xx (after the retries an idempotent call gets for 502, 503 and 504)."""


class WaitTimeout(OrchestratorError):
    """``wait`` ran past its timeout; ``last`` is the object as last seen."""

    def __init__(self, message: str, *, last: Any = None) -> None:
        super().__init__(message)
        self.last = last


_BY_STATUS: dict[int, type[OrchestratorError]] = {
    401: Unauthenticated,
    403: PermissionDenied,
    404: NotFound,
    409: Conflict,
    422: ValidationFailed,
    429: RateLimited,
}


def retry_after_seconds(response: httpx.Response) -> float | None:
    """The Retry-After header as seconds (only the delta-seconds form; the service never sends a date)."""
    value = response.headers.get("Retry-After")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


def describe_detail(detail: str | list | None) -> str:
    """One readable line: the message, or every field error as ``field.path: msg`` (the ``body`` prefix dropped)."""
    if isinstance(detail, list):
        parts = []
        for item in detail:
            if not isinstance(item, dict):
                parts.append(str(item))
                continue
            loc = [str(part) for part in item.get("loc", [])]
            if loc and loc[0] in ("body", "query", "path", "header"):
                loc = loc[1:] if len(loc) > 1 else loc
            parts.append(f"{'.'.join(loc)}: {item.get('msg', '')}" if loc else str(item.get("msg", "")))
        return "; ".join(parts)
    return "" if detail is None else str(detail)


def _detail_of(response: httpx.Response) -> str | list | None:
    try:
        body = response.json()
    except ValueError:  # not JSON: a proxy's HTML page, a plain-text answer
        text = response.text.strip()
        return text[:500] or response.reason_phrase or None
    if isinstance(body, dict) and "detail" in body:
        return body["detail"]
    return str(body)[:500]


def error_from_response(response: httpx.Response, request_id: str | None = None) -> OrchestratorError:
    """The exception for a non-2xx answer. ``request_id``: the one the client sent, when the answer has none."""
    status = response.status_code
    detail = _detail_of(response)
    kind = _BY_STATUS.get(status)
    if kind is None:
        kind = ServerError if status >= 500 else AuthError if status in (401, 403) else OrchestratorError
    kwargs: dict[str, Any] = {
        "status_code": status,
        "detail": detail,
        "request_id": response.headers.get(REQUEST_ID_HEADER) or request_id,
        "method": response.request.method,
        "url": response.request.url.path,
    }
    if kind is RateLimited:
        kwargs["retry_after"] = retry_after_seconds(response)
    return kind(describe_detail(detail) or response.reason_phrase or f"HTTP {status}", **kwargs)
