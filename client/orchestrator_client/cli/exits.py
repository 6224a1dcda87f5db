"""Every exit code ``orch`` uses, in one place, and how an SDK error or a final state maps onto one."""

from __future__ import annotations

from orchestrator_client.errors import (
    AuthError,
    Conflict,
    ConnectionFailed,
    NotFound,
    OrchestratorError,
    RateLimited,
    ValidationFailed,
)

OK = 0  # done; a followed job or sweep SUCCEEDED
FAILED = 1  # the job or sweep FAILED; a server error; anything else that went wrong
USAGE = 2  # a bad command line, a bad spec file, or a 4xx the caller can fix (401, 403, 404, 409, 422)
CANCELLED = 3  # the followed job or sweep ended CANCELLED
TIMEOUT = 124  # --timeout passed first (as timeout(1) exits); the job goes on
INTERRUPTED = 130  # Ctrl-C (128 + SIGINT); the job goes on unless --cancel-on-interrupt

_BY_STATE = {"SUCCEEDED": OK, "FAILED": FAILED, "CANCELLED": CANCELLED}


def for_state(state: str) -> int:
    """A terminal state's exit code (a state that is not terminal counts as a failure to wait for it)."""
    return _BY_STATE.get(str(state), FAILED)


def for_error(error: OrchestratorError) -> int:
    """4xx: the caller can fix it (2); 429 after the SDK's retries, 5xx, no answer: 1. An ambiguous name
    prefix is the SDK's own Conflict (no status): 2 as well."""
    if isinstance(error, AuthError | NotFound | Conflict | ValidationFailed):
        return USAGE
    status = error.status_code
    if status is not None and 400 <= status < 500 and not isinstance(error, RateLimited):
        return USAGE
    return FAILED


def error_line(error: OrchestratorError, url: str | None = None) -> str:
    """One line for people: the status, the server's detail and the request id (the SDK's ``str``), and for
    no answer at all, which URL was tried and how to set another."""
    if isinstance(error, ConnectionFailed):
        where = url or getattr(error, "url", None) or "the service"
        return (
            f"error: cannot reach {where}: {error}. Set the service's URL with --url, ORCHESTRATOR_URL "
            "or `orch login --url URL`."
        )
    return f"error: {error}"
