"""How a driver gets its run's token: claimed from the control plane at its start, never read from its environment
(docs/security.md, finding 1).

Ray lists every job's ``runtime_env`` (environment variables included), metadata and entrypoint to anyone who
holds the cluster's Ray token, which is every process on the cluster. So the control plane hands an attempt's
driver a one-use claim code (``ORCHESTRATOR_CLAIM_CODE``) instead of a token, and the driver exchanges it first
thing, before it imports Ray or PyTorch (seconds during which the code is listed):

    POST {url}/internal/v1/{jobs|sweeps}/{id}/claim   Authorization: Bearer <claim code>
    {"attempt": N, "nonce": "<random, made by this process>"}   ->   {"token": "jtk_..."}

The control plane keeps only the code's hash and answers it once: a second exchange (another nonce), a code of
an attempt that is no longer current or of a run that ended is a 401, which it logs as suspicious. The nonce
makes a retry safe: after a transport error (the answer may have been lost after the control plane committed),
this process asks again with the same nonce and gets a new token (the lost one stops working); nobody else
knows the nonce, so a copy of the code read from Ray's job table is refused. A driver whose claim is refused
exits without running (``ClaimRefused``): the reconciler gives the run a new attempt with a new code.

The token then lives in the driver's memory, and reaches its workers through Ray Train's ``train_loop_config``
as a ``RunToken``, whose ``str`` and ``repr`` hide it (Ray Train's state API lists that config by each value's
``str``); ``reveal`` gives the value to the one header it is for. This module imports only the standard
library and httpx: the drivers run it before their heavy imports.
"""

from __future__ import annotations

import logging
import os
import secrets

import httpx

from workers.runtime.retry import RetryableStatus, RetryPolicy, raise_if_retryable

log = logging.getLogger(__name__)

CLAIM_CODE_ENV = "ORCHESTRATOR_CLAIM_CODE"
# As the assignment's fetch (workers.train.driver.FETCH_RETRY): about 15 s of a control plane away, then the
# attempt fails its start and the control plane decides.
CLAIM_RETRY = RetryPolicy(first_delay_s=1.0, cap_s=10.0, max_tries=5)
CLAIM_TIMEOUT_S = 10.0


class RunToken:
    """A run's token, shown as ``RunToken(<hidden>)`` by ``str`` and ``repr`` (so in Ray Train's listing of a
    run's ``train_loop_config`` and in any log line); ``reveal()`` is the value. It pickles as itself."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __bool__(self) -> bool:
        return bool(self._value)

    def __repr__(self) -> str:
        return "RunToken(<hidden>)"

    __str__ = __repr__

    def __getstate__(self) -> str:
        return self._value

    def __setstate__(self, value: str) -> None:
        self._value = value


def reveal(token: RunToken | str | None) -> str:
    """The token's value ("" for none): a ``RunToken``'s, or a plain string as scripts and tests pass it."""
    if isinstance(token, RunToken):
        return token.reveal()
    return token or ""


def bearer(token: RunToken | str | None) -> dict[str, str]:
    """The ``Authorization`` header of a run's requests to its ``/internal`` routes."""
    return {"Authorization": f"Bearer {reveal(token)}"}


class ClaimRefused(RuntimeError):
    """The control plane refused this driver's claim code (401, or another 4xx): it was exchanged already, its
    attempt is no longer current, or its run ended. Waiting will not change that."""


def claim_code_from_environment() -> str | None:
    """The code Ray was handed for this attempt's driver; None when it was started without one."""
    return os.environ.get(CLAIM_CODE_ENV) or None


def claim_token(
    url: str,
    collection: str,
    run_id: str,
    attempt: int,
    code: str,
    *,
    retry: RetryPolicy = CLAIM_RETRY,
    timeout_s: float = CLAIM_TIMEOUT_S,
) -> RunToken:
    """Exchange ``code`` for the run's token (``collection``: "jobs" or "sweeps"), retried with one nonce while
    the control plane is away (a transport error, a 5xx, 408 or 429). ``ClaimRefused`` for any other 4xx;
    ``RuntimeError`` when the tries run out."""
    endpoint = f"{url.rstrip('/')}/internal/v1/{collection}/{run_id}/claim"
    body = {"attempt": attempt, "nonce": secrets.token_urlsafe(32)}

    def post() -> httpx.Response:
        return raise_if_retryable(httpx.post(endpoint, json=body, headers=bearer(code), timeout=timeout_s))

    try:
        response = retry.call(
            post, retry_on=(httpx.TransportError, RetryableStatus), what="claiming the run's token", logger=log
        )
    except (httpx.TransportError, RetryableStatus) as exc:
        raise RuntimeError(f"no token from {endpoint} after {retry.max_tries} tries: {exc}") from exc
    if not response.is_success:
        raise ClaimRefused(
            f"the control plane refused this driver's claim code for {collection[:-1]} {run_id} attempt {attempt} "
            f"(HTTP {response.status_code}: {response.text[:200]}): it was exchanged already, or the attempt is "
            "no longer current"
        )
    return RunToken(response.json()["token"])
