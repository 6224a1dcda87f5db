"""Helpers for the CLI's unit tests (tests/unit/test_cli_*.py): run ``orch`` in-process (typer's CliRunner)
against the ``live`` server, and drive a job the way its driver and Ray would."""

from __future__ import annotations

import time

import httpx
import pytest
from typer.testing import CliRunner

from orchestrator.backend import RunStatus
from orchestrator_client.cli import app, follow
from tests.unit.api_helpers import ADMIN, reconcile, run_token_at, tick


@pytest.fixture(autouse=True)
def quick_follow(tmp_path, monkeypatch):
    """For every test of a module that names it (``_own_config = cli_support.quick_follow``): its own config
    folder (no profile leaks between tests), and a follow that polls every 0.1 s."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setattr(follow, "POLL_S", 0.1)


def orch(live, *args: str, token: str | None = ADMIN, input: str | None = None):
    """``orch --url <live> --token <token> ARGS...``; the result has exit_code, stdout, stderr, output."""
    options = ["--url", live.url] + (["--token", token] if token else [])
    return CliRunner().invoke(app, [*options, *args], input=input, catch_exceptions=False)


def newest(live, kind: str = "jobs") -> str:
    """The id of the newest job (or sweep), once there is one: for a thread that plays the driver while a
    follow runs (over plain HTTP: CliRunner swaps sys.stdout, so only the test's thread may use it)."""
    deadline = time.monotonic() + 10
    while True:
        response = httpx.get(f"{live.url}/v1/{kind}", headers={"Authorization": f"Bearer {ADMIN}"})
        items = response.json()
        items = items["items"] if isinstance(items, dict) else items
        if items:
            return items[0]["id"]
        assert time.monotonic() < deadline, f"no {kind} submitted"
        time.sleep(0.05)


def start(live, job_id: str) -> str:
    """Admit the job (STARTING, attempt 1 submitted to the fake Ray); returns its run token."""
    tick(live.app)
    return run_token_at(live.url, live.backend, f"{job_id}-1")


def running(live, job_id: str, *events: dict) -> str:
    """Admit the job and report it RUNNING, then ``events``, as its driver does first; returns its run token."""
    token = start(live, job_id)
    report(live, job_id, token, {"type": "state", "state": "running"}, *events)
    return token


def report(live, job_id: str, token: str, *events: dict) -> None:
    """What the job's driver reports (state, metrics, checkpoints) over the internal route."""
    response = httpx.post(
        f"{live.url}/internal/v1/jobs/{job_id}/events",
        json={"attempt": 1, "events": list(events)},
        headers={"Authorization": f"Bearer {token}"},
    )
    assert response.status_code == 200, response.text


def finish_run(live, job_id: str, status: RunStatus = RunStatus.SUCCEEDED) -> None:
    """The Ray job ends (so a follow's stream ends), and the reconciler sees it, applying the end the driver
    reported (a FAILED Ray job: the driver's exit status for a failure it reported, 3)."""
    live.backend.runs[f"{job_id}-1"] = status
    if status == RunStatus.FAILED:
        live.backend.exit_codes[f"{job_id}-1"] = 3
    reconcile(live.app)
