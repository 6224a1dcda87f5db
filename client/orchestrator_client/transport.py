"""HTTP to the service, in one place: the base URL, the bearer key, a User-Agent, an ``X-Request-ID`` per
call, the mapping of error answers to ``orchestrator_client.errors``, and retries.

Retries (tenacity, jittered exponential backoff) happen only where repeating the request cannot do a thing
twice: GET and HEAD, and a POST that carries an ``Idempotency-Key`` (or that the caller marks idempotent,
like a content-addressed code upload). What is retried: no answer (connection refused, reset, timeouts),
502, 503, 504, and 429 after the Retry-After the server asked for.
"""

from __future__ import annotations

import platform
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Literal

import httpx
from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_random_exponential

from orchestrator_client.errors import (
    REQUEST_ID_HEADER,
    ConnectionFailed,
    error_from_response,
    retry_after_seconds,
)

RETRYABLE_STATUSES = frozenset({429, 502, 503, 504})
IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
IDEMPOTENCY_HEADER = "Idempotency-Key"
MAX_RETRY_AFTER_S = 60.0  # a Retry-After above this is waited only this long between tries


def idempotency_headers(key: str | Literal[False] | None) -> dict[str, str]:
    """The ``Idempotency-Key`` header of a create (jobs, sweeps, deployments): ``key``, a fresh one when None (so
    the create is retried safely), none when False."""
    return {} if key is False else {IDEMPOTENCY_HEADER: key or uuid.uuid4().hex}


def _version() -> str:
    from importlib import metadata

    for distribution in ("orchestrator-client", "ray-orchestrator"):
        try:
            return metadata.version(distribution)
        except metadata.PackageNotFoundError:
            continue
    return "0+unknown"


USER_AGENT = f"orchestrator-client/{_version()} python/{platform.python_version()} httpx/{httpx.__version__}"


class _RetryableAnswer(Exception):
    """An answer worth another try (502/503/504/429); carries it, to raise as an error once tries run out."""

    def __init__(self, response: httpx.Response) -> None:
        super().__init__(response.status_code)
        self.response = response


def _retryable(exc: BaseException) -> bool:
    """An answer worth another try, or no answer for a reason that may pass (not a malformed URL, say)."""
    return isinstance(exc, _RetryableAnswer | httpx.TimeoutException | httpx.NetworkError | httpx.RemoteProtocolError)


class Transport:
    """An ``httpx.Client`` with the service's conventions. ``http_transport``: an httpx transport to use
    instead of the network (tests: ``httpx.MockTransport``). ``backoff``: the first retry's scale in seconds."""

    def __init__(
        self,
        url: str,
        token: str | None,
        *,
        timeout: float = 30.0,
        retries: int = 4,
        backoff: float = 0.5,
        max_backoff: float = 10.0,
        http_transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.retries = max(0, retries)
        self.backoff = backoff
        self.max_backoff = max_backoff
        headers = {"User-Agent": USER_AGENT, "Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout, transport=http_transport)
        self.requests_sent = 0  # every try, retries included (tests and the CLI's --verbose read it)

    def close(self) -> None:
        self.http.close()

    # --- the calls ---------------------------------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | list[tuple[str, Any]] | None = None,
        json: Any = None,
        headers: Mapping[str, str] | None = None,
        files: Callable[[], dict[str, Any]] | None = None,
        idempotent: bool | None = None,
        ok: tuple[int, ...] = (),
        timeout: float | httpx.Timeout | None = None,
    ) -> httpx.Response:
        """Send one call (retried when idempotent), return the 2xx answer (or one whose status is in ``ok``);
        raise the matching ``OrchestratorError`` otherwise. ``files``: a function that builds the multipart
        files afresh for every try (a retried upload must send its file from the start)."""
        method = method.upper()
        request_headers = {REQUEST_ID_HEADER: uuid.uuid4().hex, **(headers or {})}
        if idempotent is None:
            idempotent = method in IDEMPOTENT_METHODS or IDEMPOTENCY_HEADER in request_headers

        def attempt() -> httpx.Response:
            self.requests_sent += 1
            response = self.http.request(
                method,
                path,
                params=_clean(params),
                json=json,
                headers=request_headers,
                files=files() if files else None,
                timeout=timeout if timeout is not None else httpx.USE_CLIENT_DEFAULT,
            )
            if response.status_code in RETRYABLE_STATUSES and response.status_code not in ok:
                raise _RetryableAnswer(response)
            return response

        response = self._run(attempt, idempotent, method, path, request_headers[REQUEST_ID_HEADER])
        if response.is_success or response.status_code in ok:
            return response
        raise error_from_response(response, request_headers[REQUEST_ID_HEADER])

    @contextmanager
    def stream(
        self, method: str, path: str, *, params: Mapping[str, Any] | None = None, read_timeout: float | None = None
    ) -> Iterator[httpx.Response]:
        """An answer whose body is read as it comes (a followed log). Opening it is retried like any GET; a
        stream cut off midway is not re-opened (it would repeat lines). ``read_timeout``: None waits forever
        between chunks (a quiet job prints nothing for minutes)."""
        method = method.upper()
        request_id = uuid.uuid4().hex
        timeout = httpx.Timeout(self.timeout, read=read_timeout)

        def attempt() -> httpx.Response:
            self.requests_sent += 1
            request = self.http.build_request(
                method, path, params=_clean(params), headers={REQUEST_ID_HEADER: request_id}, timeout=timeout
            )
            response = self.http.send(request, stream=True)
            if not response.is_success:
                response.read()
                response.close()
                if response.status_code in RETRYABLE_STATUSES:
                    raise _RetryableAnswer(response)
            return response

        response = self._run(attempt, method in IDEMPOTENT_METHODS, method, path, request_id)
        if not response.is_success:
            raise error_from_response(response, request_id)
        try:
            yield response
        finally:
            response.close()

    def call_url(
        self, method: str, url: str, *, json: Any = None, with_token: bool = True, timeout: float | None = None
    ) -> httpx.Response:
        """A call to another server than the service (a deployment's Serve URL); never retried (a prediction
        is a POST without an Idempotency-Key). The key is sent only when ``with_token``."""
        request_id = uuid.uuid4().hex
        request = self.http.build_request(
            method,
            url,
            json=json,
            headers={REQUEST_ID_HEADER: request_id},
            timeout=timeout if timeout is not None else httpx.USE_CLIENT_DEFAULT,
        )
        if not with_token:
            request.headers.pop("Authorization", None)
        try:
            self.requests_sent += 1
            response = self.http.send(request)  # an absolute URL: the client's base URL does not apply
        except httpx.TransportError as exc:
            raise ConnectionFailed(
                f"no answer from {url}: {exc}", request_id=request_id, method=method.upper(), url=url
            ) from exc
        if not response.is_success:
            raise error_from_response(response, request_id)
        return response

    # --- retries -----------------------------------------------------------------------------------------------

    def _wait(self, retry_state: Any) -> float:
        exc = retry_state.outcome.exception() if retry_state.outcome else None
        if isinstance(exc, _RetryableAnswer) and exc.response.status_code == 429:
            asked = retry_after_seconds(exc.response)
            if asked is not None:
                return min(asked, MAX_RETRY_AFTER_S)
        return wait_random_exponential(multiplier=self.backoff, max=self.max_backoff)(retry_state)

    def _run(
        self, attempt: Callable[[], httpx.Response], idempotent: bool, method: str, path: str, request_id: str
    ) -> httpx.Response:
        tries = self.retries + 1 if idempotent else 1
        retrying = Retrying(
            stop=stop_after_attempt(tries), wait=self._wait, retry=retry_if_exception(_retryable), reraise=True
        )
        try:
            return retrying(attempt)
        except _RetryableAnswer as exc:
            return exc.response  # tries ran out: the caller raises the answer's error
        except httpx.TransportError as exc:
            tried = f" after {tries} tries" if tries > 1 else ""
            raise ConnectionFailed(
                f"no answer from {self.url}{tried}: {type(exc).__name__}: {exc}",
                request_id=request_id,
                method=method,
                url=path,
            ) from exc


def _clean(params: Mapping[str, Any] | list[tuple[str, Any]] | None) -> Any:
    """Query parameters without the None ones (an argument left out is not sent at all)."""
    if params is None:
        return None
    items = params.items() if isinstance(params, Mapping) else params
    return [(key, _query_value(value)) for key, value in items if value is not None]


def _query_value(value: Any) -> Any:
    if isinstance(value, bool):
        return "true" if value else "false"
    return value
