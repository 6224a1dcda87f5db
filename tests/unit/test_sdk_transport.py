"""The SDK's transport with a stand-in server (httpx.MockTransport) and a closed port: what is retried (GET,
HEAD, a POST with an Idempotency-Key: on no answer, 502/503/504, and 429 after its Retry-After) and what is
never (a POST without a key, PATCH, DELETE, a 500), and the headers every call carries."""

from __future__ import annotations

import time

import httpx
import pytest

from orchestrator_client import Client, ConnectionFailed, RateLimited, ServerError
from tests.conftest import free_port


def scripted(*answers):
    """A MockTransport answering each request with the next of ``answers`` (a status, or an exception to
    raise); records every request it saw."""
    seen: list[httpx.Request] = []
    queue = list(answers)

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        answer = queue.pop(0) if len(queue) > 1 else queue[0]
        if isinstance(answer, Exception):
            raise answer
        status, headers = answer if isinstance(answer, tuple) else (answer, {})
        body = {"items": [], "next_cursor": None} if status < 400 else {"detail": f"status {status}"}
        return httpx.Response(status, json=body, headers=headers)

    return httpx.MockTransport(handle), seen


def client_with(transport, retries: int = 3) -> Client:
    return Client(
        url="http://orchestrator.test", token="secret", retries=retries, backoff=0.001, http_transport=transport
    )


def test_a_get_is_retried_on_503_and_502_then_succeeds_with_one_request_id(tmp_path):
    transport, seen = scripted(503, 502, 504, 200)
    client = client_with(transport)
    assert list(client.jobs.list()) == []
    assert len(seen) == 4 and client.transport.requests_sent == 4
    assert len({r.headers["X-Request-ID"] for r in seen}) == 1  # one call: its tries share the id
    first = seen[0].headers
    assert first["Authorization"] == "Bearer secret" and first["User-Agent"].startswith("orchestrator-client/")


def test_retries_run_out_into_the_answers_error():
    transport, seen = scripted(503)
    with pytest.raises(ServerError) as error:
        client_with(transport, retries=2).jobs.list().first()
    assert len(seen) == 3 and error.value.status_code == 503 and error.value.detail == "status 503"


def test_a_500_is_not_retried():
    transport, seen = scripted(500, 200)
    with pytest.raises(ServerError):
        client_with(transport).jobs.list().first()
    assert len(seen) == 1


def test_a_post_without_an_idempotency_key_is_never_retried():
    transport, seen = scripted(503, 201)
    with pytest.raises(ServerError):
        client_with(transport).jobs.submit({"workload": "digits"}, idempotency_key=False)
    assert len(seen) == 1 and "Idempotency-Key" not in seen[0].headers
    transport, seen = scripted(httpx.ConnectError("refused"), 201)
    with pytest.raises(ConnectionFailed):
        client_with(transport).sweeps.submit({"base": {"workload": "digits"}}, idempotency_key=False)
    assert len(seen) == 1
    for method in ("PATCH", "DELETE"):
        transport, seen = scripted(503, 200)
        with pytest.raises(ServerError):
            client_with(transport).transport.request(method, "/v1/deployments/x", json={})
        assert len(seen) == 1, method


def test_a_submit_with_its_idempotency_key_is_retried_with_the_same_key():
    job = {
        "id": "j1",
        "project_id": "p",
        "name": "",
        "workload": "digits",
        "state": "QUEUED",
        "reason": "",
        "message": "",
        "attempt": 0,
        "priority": 0,
        "spec": {},
        "created_at": "2026-01-01T00:00:00Z",
        "updated_at": "2026-01-01T00:00:00Z",
        "started_at": None,
        "finished_at": None,
        "labels": {},
        "plan": None,
        "latest_metrics": None,
        "result": None,
    }
    seen = []

    def handle(request):
        seen.append(request)
        if len(seen) == 1:
            raise httpx.ReadTimeout("no answer in time")  # the server may have made the job: a retry must not make two
        return httpx.Response(201, json=job)

    submitted = client_with(httpx.MockTransport(handle)).jobs.submit({"workload": "digits"})
    assert submitted.id == "j1" and len(seen) == 2
    keys = {request.headers["Idempotency-Key"] for request in seen}
    assert len(keys) == 1 and len(keys.pop()) == 32


def test_429_waits_the_retry_after_it_was_told():
    transport, seen = scripted((429, {"Retry-After": "0.3"}), 200)
    started = time.monotonic()
    assert client_with(transport).jobs.list().first() is None
    assert len(seen) == 2 and time.monotonic() - started >= 0.3
    transport, seen = scripted((429, {"Retry-After": "7"}))
    with pytest.raises(RateLimited) as error:
        client_with(transport, retries=0).jobs.list().first()
    assert error.value.retry_after == 7.0


def test_no_answer_at_all_is_connection_failed_after_the_retries():
    client = Client(url=f"http://127.0.0.1:{free_port()}", token="t", retries=2, backoff=0.001)
    with pytest.raises(ConnectionFailed) as error:
        client.jobs.get("abc")
    assert error.value.status_code is None and "after 3 tries" in str(error.value)
    assert error.value.request_id and client.transport.requests_sent == 3


def test_an_answer_that_is_not_json_still_makes_a_readable_error():
    transport = httpx.MockTransport(lambda request: httpx.Response(502, text="<html>Bad Gateway</html>"))
    with pytest.raises(ServerError) as error:
        client_with(transport, retries=0).jobs.list().first()
    assert error.value.detail == "<html>Bad Gateway</html>" and error.value.request_id
