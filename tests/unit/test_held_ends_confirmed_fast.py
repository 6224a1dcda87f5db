"""A run whose driver reported its end is compared with Ray on its own short interval (``held_end_poll_s``,
the ``held_ends`` loop), so its end is applied as soon as Ray confirms it, not at the reconciler's next full
pass; the other runs are left to that pass."""

from __future__ import annotations

import time

from fastapi.testclient import TestClient

from api.app import create_app
from orchestrator.backend import RunStatus
from orchestrator.loops.reconciler import Reconciler
from orchestrator.settings import Settings
from tests.security.test_a_runs_report_of_its_end_waits_for_ray import MADE_UP, job, report
from tests.unit.api_helpers import ADMIN, reconcile, run_token, submit, tick

ONE_CPU = {"num_workers": 1, "cpus_per_worker": 1}


def running(app, client, backend) -> tuple[str, str]:
    job_id = submit(client, ADMIN, scaling=ONE_CPU).json()["id"]
    tick(app)
    token = run_token(client, backend)
    backend.runs[f"{job_id}-1"] = RunStatus.RUNNING
    report(client, "jobs", job_id, token, {"type": "state", "state": "running"})
    return job_id, token


def test_only_runs_with_a_held_end_are_confirmed_on_the_short_interval(app, client, backend):
    service = app.state.service
    reported, reported_token = running(app, client, backend)
    silent, _ = running(app, client, backend)
    report(client, "jobs", reported, reported_token, {"type": "state", "state": "succeeded", "result": MADE_UP})
    for job_id in (reported, silent):  # both drivers exited 0; only one reported its end first
        backend.runs[f"{job_id}-1"] = RunStatus.SUCCEEDED
        backend.exit_codes[f"{job_id}-1"] = 0

    Reconciler(service.sessions, service.backend, service.settings).confirm_held_ends()
    done = job(client, reported)
    assert (done["state"], done["result"]) == ("SUCCEEDED", MADE_UP)
    assert job(client, silent)["state"] == "RUNNING"  # not looked at: the full pass decides it
    reconcile(app)
    assert job(client, silent)["state"] == "SUCCEEDED"


def test_with_its_loops_running_a_held_end_is_applied_long_before_the_full_pass(tmp_path, backend):
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'orchestrator.db'}",
        storage=str(tmp_path / "storage"),
        var_dir=str(tmp_path / "var"),
        admin_token=ADMIN,
        scheduler_interval_s=0.05,
        reconciler_interval_s=3600,  # the full pass runs once, at the start, and not again in this test
        held_end_poll_s=0.05,
    )
    app = create_app(settings, backend=backend, run_loops=True)
    with TestClient(app) as client:
        job_id = submit(client, ADMIN, scaling=ONE_CPU).json()["id"]
        wait_for(lambda: f"{job_id}-1" in backend.runs)
        backend.runs[f"{job_id}-1"] = RunStatus.RUNNING
        token = run_token(client, backend)
        report(client, "jobs", job_id, token, {"type": "state", "state": "running"})
        report(client, "jobs", job_id, token, {"type": "state", "state": "succeeded", "result": MADE_UP})
        backend.runs[f"{job_id}-1"] = RunStatus.SUCCEEDED
        backend.exit_codes[f"{job_id}-1"] = 0
        wait_for(lambda: job(client, job_id)["state"] == "SUCCEEDED")
        assert job(client, job_id)["result"] == MADE_UP


def wait_for(condition, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "not within 10 s"
        time.sleep(0.05)
