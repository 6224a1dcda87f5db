"""Helpers for the SDK's tests (tests/unit/test_sdk_*.py) over the ``live`` fixture: a client, and a job
driven through its lifecycle the way a driver would (the scheduler's tick, then the run's own events)."""

from __future__ import annotations

import httpx

from orchestrator_client import Client
from tests.unit.api_helpers import ADMIN, run_token_at, tick


def sdk(live, token: str = ADMIN, **kwargs) -> Client:
    """A client of the live app (url and key given: no environment or config file is read)."""
    kwargs.setdefault("retries", 0)
    return Client(url=live.url, token=token, **kwargs)


def start(live, job_id: str) -> str:
    """Admit the queued job (a scheduler tick submits it to the fake cluster); returns its run token."""
    tick(live.app)
    return run_token_at(
        live.url, live.backend, next(sid for sid, _, _ in live.backend.submitted if sid.startswith(job_id))
    )


def report(live, job_id: str, token: str, *events: dict, attempt: int = 1) -> None:
    """What the job's driver reports (``/internal/v1/jobs/{id}/events``): states, metrics, checkpoints."""
    response = httpx.post(
        f"{live.url}/internal/v1/jobs/{job_id}/events",
        json={"attempt": attempt, "events": list(events)},
        headers={"Authorization": f"Bearer {token}"},
    )
    assert response.status_code == 200, response.text


def running(live, job_id: str, *events: dict) -> str:
    """Admit the job and report it RUNNING, then ``events`` (metrics, checkpoints); returns its run token."""
    token = start(live, job_id)
    report(live, job_id, token, state("running"), *events)
    return token


def state(name: str, **extra) -> dict:
    return {"type": "state", "state": name, **extra}


def metrics(epoch: int, step: int, **values) -> dict:
    return {"type": "metrics", "epoch": epoch, "step": step, "values": values}


def checkpoint(live, job_id: str, epoch: int, step: int, **metrics) -> dict:
    path = f"{live.app.state.service.settings.storage_path}/{job_id}/checkpoint_{epoch}"
    return {"type": "checkpoint", "epoch": epoch, "step": step, "path": path, "size_bytes": 10, "metrics": metrics}
