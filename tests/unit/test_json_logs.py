"""ORCHESTRATOR_LOG_FORMAT=json: every line is one JSON object with time, level, logger and message, and the
request and entity ids where known (a request's X-Request-ID and its path's job, a loop's current job)."""

from __future__ import annotations

import io
import json
import logging
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import uvicorn

from api.app import create_app
from orchestrator.log_format import JsonFormatter, configure_logging, log_handler, uvicorn_log_config
from orchestrator.request_context import log_context, request_id
from orchestrator.settings import Settings
from tests.conftest import free_port
from tests.unit.api_helpers import ADMIN, auth, submit, tick


@pytest.fixture
def json_lines() -> Iterator[io.StringIO]:
    """The root logger's records, as the json format writes them, for the length of a test."""
    stream = io.StringIO()
    handler = log_handler("json", stream)
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield stream
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def parsed(stream: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]  # fails on any line that isn't JSON


def test_a_line_carries_the_ids_it_knows_and_none_it_does_not(json_lines):
    log = logging.getLogger("orchestrator.test")
    log.info("outside")
    token = request_id.set("req-1")
    try:
        with log_context(job_id="job-1", deployment="web"):
            log.warning("inside %s", "both", extra={"trial_id": "t-9"})
    finally:
        request_id.reset(token)
    outside, inside = parsed(json_lines)
    assert set(outside) == {"time", "level", "logger", "message"}
    assert outside["level"] == "INFO" and outside["logger"] == "orchestrator.test" and outside["message"] == "outside"
    assert outside["time"].endswith("+00:00")
    assert inside == {
        "time": inside["time"],
        "level": "WARNING",
        "logger": "orchestrator.test",
        "message": "inside both",
        "request_id": "req-1",
        "job_id": "job-1",
        "trial_id": "t-9",
        "deployment": "web",
    }


def test_an_exception_and_a_multiline_message_stay_one_line(json_lines):
    try:
        raise ValueError("bad\nthing")
    except ValueError:
        logging.getLogger("x").exception("failed:\n%s", "two lines")
    [line] = parsed(json_lines)
    assert line["message"] == "failed:\ntwo lines" and "ValueError: bad" in line["exception"]


def test_a_request_about_a_job_logs_its_request_id_and_job_id(app, client, backend, json_lines):
    job = submit(client, ADMIN).json()["id"]
    tick(app)  # the scheduler's line names the job it admitted
    admitted = [line for line in parsed(json_lines) if line["logger"] == "orchestrator.loops.scheduler"]
    assert admitted and all(line["job_id"] == job and "request_id" not in line for line in admitted)

    backend.available = False  # the cancel's stop fails: a warning, logged inside the request
    response = client.post(f"/v1/jobs/{job}/cancel", headers={**auth(ADMIN), "X-Request-ID": "cancel-42"})
    assert response.status_code == 200 and response.headers["X-Request-ID"] == "cancel-42"
    [warning] = [line for line in parsed(json_lines) if "stop failed" in line["message"]]
    assert warning["level"] == "WARNING"
    assert warning["request_id"] == "cancel-42" and warning["job_id"] == job

    logging.getLogger("after").info("no request any more")  # the ids ended with the request
    assert set(parsed(json_lines)[-1]) == {"time", "level", "logger", "message"}


def test_over_real_http_the_access_log_is_json_with_the_request_and_the_job(tmp_path, backend, json_lines):
    """As `orchestrator serve` runs it with the json format: uvicorn's access log through the root handler."""
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'o.db'}",
        storage=str(tmp_path / "storage"),
        var_dir=str(tmp_path / "var"),
        admin_token=ADMIN,
    )
    app = create_app(settings, backend=backend, run_loops=False)
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="info", log_config=uvicorn_log_config("json"))
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        job = httpx.post(f"{url}/v1/jobs", json={"workload": "digits"}, headers=auth(ADMIN)).json()["id"]
        answer = httpx.get(f"{url}/v1/jobs/{job}", headers={**auth(ADMIN), "X-Request-ID": "look-7"})
        assert answer.status_code == 200 and answer.headers["X-Request-ID"] == "look-7"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
    access = [line for line in parsed(json_lines) if line["logger"] == "uvicorn.access"]
    [look] = [line for line in access if line.get("request_id") == "look-7"]
    assert look["job_id"] == job and f"GET /v1/jobs/{job}" in look["message"] and look["level"] == "INFO"
    [post] = [line for line in access if "POST /v1/jobs" in line["message"]]
    assert post["request_id"] and "job_id" not in post  # a fresh id; no job in its path


def test_text_stays_the_default_and_json_is_chosen_by_the_setting(monkeypatch):
    assert Settings().log_format == "text"
    monkeypatch.setenv("ORCHESTRATOR_LOG_FORMAT", "json")
    assert Settings().log_format == "json"
    monkeypatch.setenv("ORCHESTRATOR_LOG_FORMAT", "xml")
    with pytest.raises(ValueError, match="log_format"):
        Settings()


def test_configure_logging_installs_one_json_handler():
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        configure_logging("json")
        [handler] = root.handlers
        assert isinstance(handler.formatter, JsonFormatter)
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
