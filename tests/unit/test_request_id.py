"""X-Request-ID on every answer (api/request_id.py), over real HTTP: plain, error, and streamed responses."""

from __future__ import annotations

import logging
import re

import httpx
import pytest

from orchestrator.backend import RunStatus
from orchestrator.request_context import RequestIdFilter, request_id
from tests.unit.api_helpers import ADMIN, auth, reconcile, run_token, tick

HEX_ID = re.compile(r"[0-9a-f]{32}")


def test_a_sane_id_is_echoed_and_anything_else_replaced(live):
    with httpx.Client(base_url=live.url) as http:
        assert http.get("/healthz", headers={"X-Request-ID": "cli-42.a:b_c"}).headers["X-Request-ID"] == "cli-42.a:b_c"
        fresh = [http.get("/healthz").headers["X-Request-ID"] for _ in range(2)]
        assert all(HEX_ID.fullmatch(rid) for rid in fresh) and fresh[0] != fresh[1]
        for bad in ("x" * 129, "a b", "<script>", "id;drop", ""):
            rid = http.get("/healthz", headers={"X-Request-ID": bad}).headers["X-Request-ID"]
            assert HEX_ID.fullmatch(rid), (bad, rid)
        assert http.get("/healthz", headers={"X-Request-ID": "x" * 128}).headers["X-Request-ID"] == "x" * 128


def test_errors_carry_the_id_too(live):
    with httpx.Client(base_url=live.url) as http:
        for response in (
            http.get("/v1/jobs"),  # 401
            http.get("/v1/jobs/nope", headers=auth(ADMIN)),  # 404
            http.get("/v1/jobs/nope/logs", params={"tail": -1}, headers=auth(ADMIN)),  # 422
            http.post("/v1/jobs", content=b"x" * (3 * 1024 * 1024), headers=auth(ADMIN)),  # 413, the body cap
        ):
            assert response.status_code >= 400 and HEX_ID.fullmatch(response.headers["X-Request-ID"]), response


def test_an_unexpected_error_is_a_500_that_names_the_request(app, monkeypatch, caplog):
    from fastapi.testclient import TestClient

    from orchestrator.repositories import jobs as jobs_repo

    def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(jobs_repo, "list_jobs", broken)
    with TestClient(app, raise_server_exceptions=False) as client:
        response = client.get("/v1/jobs", headers={**auth(ADMIN), "X-Request-ID": "find-me"})
    assert response.status_code == 500 and response.headers["X-Request-ID"] == "find-me"
    assert response.json() == {"detail": "internal server error"}
    assert any("request find-me (GET /v1/jobs) failed" in r.getMessage() and r.exc_info for r in caplog.records)


def test_a_followed_log_streams_with_the_id(live):
    """The middleware must not buffer: the first chunk of a running job's followed log arrives (with the
    header) while the job still runs, and the stream ends when the job does."""
    backend = live.backend
    with httpx.Client(base_url=live.url, timeout=10) as http:
        job = http.post("/v1/jobs", json={"workload": "digits"}, headers=auth(ADMIN)).json()["id"]
        tick(live.app)
        token = run_token(http, backend)
        running = {"attempt": 1, "events": [{"type": "state", "state": "running"}]}
        http.post(f"/internal/v1/jobs/{job}/events", json=running, headers=auth(token))
        live.app.state.service.log_follows.poll_s = 0.05
        with http.stream(
            "GET", f"/v1/jobs/{job}/logs", params={"follow": "true"}, headers={**auth(ADMIN), "X-Request-ID": "f-1"}
        ) as stream:
            assert stream.headers["X-Request-ID"] == "f-1"
            chunks = stream.iter_text()
            assert next(chunks) == f"log of {job}-1\n"  # before the job ended: streamed, not buffered
            ended = {"attempt": 1, "events": [{"type": "state", "state": "succeeded"}]}
            http.post(f"/internal/v1/jobs/{job}/events", json=ended, headers=auth(token))
            backend.runs[f"{job}-1"] = RunStatus.SUCCEEDED  # and its driver exited
            reconcile(live.app)  # which confirms the reported end
            assert list(chunks) == []


@pytest.mark.parametrize("inside", [True, False])
def test_log_records_can_name_the_request(inside):
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "hello", None, None)
    token = request_id.set("r-7") if inside else None
    try:
        assert RequestIdFilter().filter(record) and record.request_id == ("r-7" if inside else "-")
    finally:
        if token is not None:
            request_id.reset(token)
