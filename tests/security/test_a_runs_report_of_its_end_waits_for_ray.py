"""A run's end is Ray's word, not the run's (docs/security.md, "A run's report of its end waits for Ray").

The control plane took a run's word that it ended. An event ``{"type": "state", "state":
"succeeded", "result": ...}`` made the job SUCCEEDED at once while its Ray job went on RUNNING: its usage stopped,
its CPUs were admitted to the next run, its made-up result was shown, and nothing stopped the Ray job.

Now a run's report of its end is held (the run stays RUNNING, accounted, holding its resources, no result shown)
until Ray says the Ray job ended that way; the reconciler then applies it, result included. When Ray says it
ended otherwise (FAILED, STOPPED), the report is dropped: the run is decided by Ray's word alone, as for a driver
whose report never arrived (a new attempt, or FAILED), and the message says the report was not confirmed.

What it proved on the old code (at 5169c62, the token read as it was then, from ``ORCHESTRATOR_JOB_TOKEN``):
``test_a_reported_success_waits_for_ray_to_say_the_job_ended`` failed with "assert 'SUCCEEDED' == 'RUNNING'"
right after the report; ``test_a_reported_success_ray_does_not_confirm_is_not_recorded`` (both Ray ends) likewise;
``test_a_sweeps_reported_end_waits_for_ray_too`` the same for a sweep.
``test_a_report_after_ray_says_the_job_ended_is_applied_at_once`` passed there and passes now: it guards the
fast path (a report that comes once Ray already says the job ended needs no reconciler).
"""

from __future__ import annotations

import pytest
from sqlalchemy import select

from orchestrator.backend import RunStatus
from orchestrator.db.models import UsageInterval
from tests.unit.api_helpers import ADMIN, auth, reconcile, run_token, submit, tick
from tests.unit.test_sweeps import post_sweep

ALL_CPUS = {"num_workers": 2, "cpus_per_worker": 2}  # the fake cluster's 4
MADE_UP = {"metrics": {"val_accuracy": 1.0}, "checkpoint_path": None}


def report(client, collection: str, run_id: str, token: str, *events: dict):
    answer = client.post(
        f"/internal/v1/{collection}/{run_id}/events", json={"attempt": 1, "events": list(events)}, headers=auth(token)
    )
    assert answer.status_code == 200, answer.text
    return answer


def job(client, job_id: str) -> dict:
    return client.get(f"/v1/jobs/{job_id}", headers=auth(ADMIN)).json()


def open_usage(app, subject_id: str) -> list[UsageInterval]:
    with app.state.service.sessions() as session:
        stretches = session.scalars(select(UsageInterval).where(UsageInterval.subject_id == subject_id)).all()
        return [s for s in stretches if s.ended_at is None]


def running_job(app, client, backend) -> tuple[str, str]:
    job_id = submit(client, ADMIN, scaling=ALL_CPUS).json()["id"]
    tick(app)
    token = run_token(client, backend)
    backend.runs[f"{job_id}-1"] = RunStatus.RUNNING
    report(client, "jobs", job_id, token, {"type": "state", "state": "running"})
    assert job(client, job_id)["state"] == "RUNNING"
    return job_id, token


def test_a_reported_success_waits_for_ray_to_say_the_job_ended(app, client, backend):
    job_id, token = running_job(app, client, backend)
    report(client, "jobs", job_id, token, {"type": "state", "state": "succeeded", "result": MADE_UP})
    held = job(client, job_id)
    assert held["state"] == "RUNNING"
    assert held["result"] is None and held["finished_at"] is None
    assert held["reason"] == "end_reported", held
    assert len(open_usage(app, job_id)) == 1  # its usage clock runs on
    waiting = submit(client, ADMIN, scaling={"num_workers": 1, "cpus_per_worker": 1}).json()["id"]
    tick(app)
    assert job(client, waiting)["state"] == "QUEUED"  # its CPUs are still held
    reconcile(app)  # Ray says the job still runs: nothing changes
    assert job(client, job_id)["state"] == "RUNNING"

    backend.runs[f"{job_id}-1"] = RunStatus.SUCCEEDED  # the driver exited 0
    backend.exit_codes[f"{job_id}-1"] = 0
    reconcile(app)
    done = job(client, job_id)
    assert (done["state"], done["reason"], done["result"]) == ("SUCCEEDED", "completed", MADE_UP)
    assert open_usage(app, job_id) == []
    tick(app)
    assert job(client, waiting)["state"] == "STARTING"


@pytest.mark.parametrize(
    ("ray_end", "exit_code", "becomes", "reason"),
    [
        # A driver that failed after its report (or a report that was not its driver's): a new attempt, resumed.
        (RunStatus.FAILED, 1, "RESTARTING", "driver_failed"),
        (RunStatus.STOPPED, None, "FAILED", "stopped_externally"),
    ],
)
def test_a_reported_success_ray_does_not_confirm_is_not_recorded(
    app, client, backend, ray_end, exit_code, becomes, reason
):
    job_id, token = running_job(app, client, backend)
    report(client, "jobs", job_id, token, {"type": "state", "state": "succeeded", "result": MADE_UP})
    assert job(client, job_id)["state"] == "RUNNING"
    backend.runs[f"{job_id}-1"] = ray_end
    if exit_code is not None:
        backend.exit_codes[f"{job_id}-1"] = exit_code
    reconcile(app)
    ended = job(client, job_id)
    assert (ended["state"], ended["reason"], ended["result"]) == (becomes, reason, None), ended
    assert "its own report that it succeeded was not confirmed" in ended["message"]


def test_a_reported_failure_waits_for_the_drivers_own_exit_status(app, client, backend):
    """``failed`` is applied (with its cause) only when Ray says FAILED with the driver's status for it (3)."""
    job_id, token = running_job(app, client, backend)
    failure = {"type": "state", "state": "failed", "reason": "oom", "message": "out of memory"}
    report(client, "jobs", job_id, token, failure)
    assert job(client, job_id)["state"] == "RUNNING"
    backend.runs[f"{job_id}-1"] = RunStatus.FAILED
    backend.exit_codes[f"{job_id}-1"] = 3
    reconcile(app)
    ended = job(client, job_id)
    assert (ended["state"], ended["reason"], ended["message"]) == ("FAILED", "oom", "out of memory")


def test_a_report_after_ray_says_the_job_ended_is_applied_at_once(app, client, backend):
    job_id, token = running_job(app, client, backend)
    backend.runs[f"{job_id}-1"] = RunStatus.SUCCEEDED
    report(client, "jobs", job_id, token, {"type": "state", "state": "succeeded", "result": MADE_UP})
    done = job(client, job_id)
    assert (done["state"], done["result"]) == ("SUCCEEDED", MADE_UP)


def test_a_sweeps_reported_end_waits_for_ray_too(app, client, backend):
    sweep_id = post_sweep(client, max_concurrent_trials=1).json()["id"]
    tick(app)
    token = run_token(client, backend)
    backend.runs[f"{sweep_id}-1"] = RunStatus.RUNNING
    report(client, "sweeps", sweep_id, token, {"type": "state", "state": "running"})
    report(client, "sweeps", sweep_id, token, {"type": "state", "state": "succeeded", "result": {"trials": 8}})

    def state() -> str:
        return client.get(f"/v1/sweeps/{sweep_id}", headers=auth(ADMIN)).json()["state"]

    assert state() == "RUNNING"
    reconcile(app)
    assert state() == "RUNNING"
    backend.runs[f"{sweep_id}-1"] = RunStatus.SUCCEEDED
    reconcile(app)
    assert state() == "SUCCEEDED"
