"""Deadlines, docs/jobs.md "Deadlines": ``max_runtime_s`` counts RUNNING time only, over every attempt; past it
a job or a sweep is asked to checkpoint and stop, as a preemption asks, and ends FAILED ``deadline_exceeded``
(the fake cluster; the real one: tests/integration/test_cli_on_ray.py)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select

from orchestrator.backend import RunStatus
from orchestrator.db.models import JobEvent, JobState, SweepEvent
from orchestrator.services.deadlines import seconds_in
from orchestrator.states.jobs import lock_job, set_job_state
from orchestrator_contract.jobs import DriverExit
from tests.unit.api_helpers import ADMIN, auth, reconcile, run_token, submit, tick

S = JobState
T0 = datetime(2026, 1, 1, tzinfo=UTC)
GRACE_S = 30.0


@dataclass
class Row:
    to_state: JobState
    at_s: float

    @property
    def created_at(self) -> datetime:
        return T0 + timedelta(seconds=self.at_s)


def test_only_running_time_counts_over_every_attempt():
    history = [
        Row(S.QUEUED, 0),
        Row(S.STARTING, 100),  # 100 s queued, then starting: neither counts
        Row(S.RUNNING, 110),
        Row(S.RUNNING, 130),  # a request's row (from = to): the stretch goes on
        Row(S.RESTARTING, 160),  # 50 s running
        Row(S.RUNNING, 170),
        Row(S.QUEUED, 180),  # 10 s running, then preempted: queued time does not count
        Row(S.STARTING, 900),
        Row(S.RUNNING, 905),
    ]
    now = T0 + timedelta(seconds=925)  # 20 s into the running stretch
    assert seconds_in(history, frozenset({S.RUNNING}), now) == 80.0
    assert seconds_in(history[:1], frozenset({S.RUNNING}), now) == 0.0
    assert seconds_in([], frozenset({S.RUNNING}), now) == 0.0


@pytest.fixture
def settings_overrides() -> dict:
    return {"preemption_grace_s": GRACE_S}


def running(app, client, backend, body_path: str = "jobs", **spec) -> tuple[str, str]:
    """A job (or a sweep, ``body_path="sweeps"``) submitted by the admin and reported RUNNING by its driver."""
    if body_path == "jobs":
        run_id = submit(client, ADMIN, **spec).json()["id"]
    else:
        created = client.post("/v1/sweeps", json=spec, headers=auth(ADMIN))
        assert created.status_code == 201, created.text
        run_id = created.json()["id"]
    tick(app)
    token = run_token(client, backend)
    started = {"attempt": 1, "events": [{"type": "state", "state": "running"}]}
    assert (
        client.post(f"/internal/v1/{body_path}/{run_id}/events", json=started, headers=auth(token)).status_code == 200
    )
    backend.runs[f"{run_id}-1"] = RunStatus.RUNNING
    return run_id, token


def age_history(app, model, column, run_id: str, seconds: float) -> None:
    """Move every history row of the run ``seconds`` into the past: as if it had been running that much longer."""
    with app.state.service.sessions.begin() as session:
        for row in session.scalars(select(model).where(column == run_id)):
            row.created_at -= timedelta(seconds=seconds)


def job_events(client, job_id: str) -> list[tuple[str, str]]:
    return [(e["to_state"], e["reason"]) for e in client.get(f"/v1/jobs/{job_id}/events", headers=auth(ADMIN)).json()]


def test_a_job_past_its_deadline_checkpoints_stops_and_fails_deadline_exceeded(app, client, backend):
    job, token = running(app, client, backend, max_runtime_s=60, preemptible=False)  # a deadline stops it anyway
    control = f"/internal/v1/jobs/{job}/control"
    reconcile(app)  # a few ms in: nothing asked
    assert client.get(control, params={"attempt": 1}, headers=auth(token)).json() == {
        "checkpoint_now": False,
        "stacks_wanted": None,
        "stop_trials": [],
        "trial_stacks_wanted": {},
        "end_workers": [],
    }

    age_history(app, JobEvent, JobEvent.job_id, job, 61)
    reconcile(app)
    body = client.get(f"/v1/jobs/{job}", headers=auth(ADMIN)).json()
    assert (body["state"], body["reason"]) == ("RUNNING", "deadline_reached"), body
    assert "its max_runtime_s is 60 s" in body["message"]
    assert client.get(control, params={"attempt": 1}, headers=auth(token)).json() == {
        "checkpoint_now": True,
        "stacks_wanted": None,
        "stop_trials": [],
        "trial_stacks_wanted": {},
        "end_workers": [],
    }
    # The stop's own failure, reported by the driver, is not the job's failure.
    failed = {"attempt": 1, "events": [{"type": "state", "state": "failed", "reason": "worker_died"}]}
    assert client.post(f"/internal/v1/jobs/{job}/events", json=failed, headers=auth(token)).json()["applied"] == 0
    reconcile(app)  # still running, within the grace: asked once, nothing stopped
    assert backend.stopped == []
    assert job_events(client, job).count(("RUNNING", "deadline_reached")) == 1

    backend.runs[f"{job}-1"] = RunStatus.FAILED  # the driver checkpointed and exited
    backend.exit_codes[f"{job}-1"] = DriverExit.PREEMPTED
    reconcile(app)
    body = client.get(f"/v1/jobs/{job}", headers=auth(ADMIN)).json()
    assert (body["state"], body["reason"], body["attempt"]) == ("FAILED", "deadline_exceeded", 1), body
    assert "past its max_runtime_s: checkpointed and stopped" in body["message"]
    assert "it had taken no checkpoint" in body["message"]
    assert job_events(client, job)[-2:] == [("RUNNING", "deadline_reached"), ("FAILED", "deadline_exceeded")]
    tick(app)  # never admitted again
    assert client.get(f"/v1/jobs/{job}", headers=auth(ADMIN)).json()["state"] == "FAILED"


def test_a_job_that_does_not_stop_is_stopped_after_the_grace_and_still_fails_deadline_exceeded(app, client, backend):
    job, _ = running(app, client, backend, max_runtime_s=5)
    age_history(app, JobEvent, JobEvent.job_id, job, 6)
    reconcile(app)
    service = app.state.service
    with service.sessions.begin() as session:
        job_row = lock_job(session, job)
        job_row.preempt_requested_at -= timedelta(seconds=GRACE_S + 1)
    reconcile(app)
    assert backend.stopped == [f"{job}-1"]
    reconcile(app)  # the fake marks a stopped run STOPPED
    body = client.get(f"/v1/jobs/{job}", headers=auth(ADMIN)).json()
    assert (body["state"], body["reason"]) == ("FAILED", "deadline_exceeded"), body
    assert "past its max_runtime_s: stopped" in body["message"]


def test_time_spent_restarting_is_not_counted(app, client, backend):
    job, _ = running(app, client, backend, max_runtime_s=60)
    age_history(app, JobEvent, JobEvent.job_id, job, 50)  # 50 s running
    service = app.state.service
    with service.sessions.begin() as session:  # then the worker group is placed again, for 20 s
        set_job_state(session, lock_job(session, job), S.RESTARTING, "worker_died")
    age_history(app, JobEvent, JobEvent.job_id, job, 20)
    with service.sessions.begin() as session:
        set_job_state(session, lock_job(session, job), S.RUNNING, "training_started")
    reconcile(app)  # 70 s since it first ran, 50 s of it running: not yet
    assert client.get(f"/v1/jobs/{job}", headers=auth(ADMIN)).json()["reason"] == "training_started"
    age_history(app, JobEvent, JobEvent.job_id, job, 11)
    reconcile(app)  # 61 s running
    assert client.get(f"/v1/jobs/{job}", headers=auth(ADMIN)).json()["reason"] == "deadline_reached"


def test_a_job_that_finishes_before_it_stops_succeeds(app, client, backend):
    job, _ = running(app, client, backend, max_runtime_s=1)
    age_history(app, JobEvent, JobEvent.job_id, job, 2)
    reconcile(app)
    backend.runs[f"{job}-1"] = RunStatus.SUCCEEDED
    reconcile(app)
    body = client.get(f"/v1/jobs/{job}", headers=auth(ADMIN)).json()
    assert (body["state"], body["reason"]) == ("SUCCEEDED", "completed"), body
    assert "before its deadline's stop" in body["message"]


SWEEP_BODY = {
    "base": {"workload": "digits", "scaling": {"num_workers": 1, "cpus_per_worker": 1}},
    "search_space": {"lr.base": {"type": "choice", "values": [0.1, 0.2]}},
    "max_concurrent_trials": 2,
}


def test_a_sweep_past_its_deadline_fails_deadline_exceeded(app, client, backend):
    sweep, token = running(app, client, backend, "sweeps", **SWEEP_BODY, max_runtime_s=120)
    age_history(app, SweepEvent, SweepEvent.sweep_id, sweep, 121)
    reconcile(app)
    body = client.get(f"/v1/sweeps/{sweep}", headers=auth(ADMIN)).json()
    assert (body["state"], body["reason"]) == ("RUNNING", "deadline_reached"), body
    control = f"/internal/v1/sweeps/{sweep}/control"
    assert client.get(control, params={"attempt": 1}, headers=auth(token)).json() == {
        "checkpoint_now": True,
        "stacks_wanted": None,
        "stop_trials": [],
        "trial_stacks_wanted": {},
        "end_workers": [],
    }
    backend.runs[f"{sweep}-1"] = RunStatus.FAILED
    backend.exit_codes[f"{sweep}-1"] = DriverExit.PREEMPTED
    reconcile(app)
    body = client.get(f"/v1/sweeps/{sweep}", headers=auth(ADMIN)).json()
    assert (body["state"], body["reason"]) == ("FAILED", "deadline_exceeded"), body
    assert "its finished trials and every checkpoint are kept" in body["message"]


@pytest.mark.parametrize("value", [0, -5, 400 * 24 * 3600, "soon"])
def test_a_bad_deadline_is_a_422(client, value):
    answer = submit(client, ADMIN, max_runtime_s=value)
    assert answer.status_code == 422 and "max_runtime_s" in answer.text, answer.text


def test_a_bad_deadline_per_trial_is_a_422_naming_base(client):
    body = {**SWEEP_BODY, "base": {**SWEEP_BODY["base"], "max_runtime_s": -5}}
    answer = client.post("/v1/sweeps", json=body, headers=auth(ADMIN))
    assert answer.status_code == 422 and "max_runtime_s" in answer.text, answer.text
