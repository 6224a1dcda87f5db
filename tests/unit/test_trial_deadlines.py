"""A deadline per sweep trial (a sweep's ``base.max_runtime_s``; docs/jobs.md "Deadlines"): the control plane lists
the trials past theirs in the sweep's control signal (``stop_trials``), each trial's rank 0 hears its own id,
checkpoints and stops, and the trial fails ``deadline_exceeded`` while the sweep goes on. The control plane on the
fake cluster; the worker's side with a tiny control plane over HTTP (the real cluster:
tests/integration/test_sweeps_on_ray.py)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
from sqlalchemy import select

from orchestrator.db.models import JobState, SweepEvent, Trial, TrialEvent, TrialState
from orchestrator.services.deadlines import trial_runtime_s
from tests.unit.api_helpers import ADMIN, auth
from tests.unit.http_stub import JsonHandler, serving
from tests.unit.test_deadlines import SWEEP_BODY, age_history, running
from workers.runtime.control import ControlPoller, control_poller
from workers.runtime.train_loop import DEADLINE_KEY, PREEMPTED_KEY, stopped
from workers.train.failures import TrialDeadlineExceeded, classify_trial_error

T0 = datetime(2026, 11, 29, tzinfo=UTC)


def row(state, seconds: float) -> SimpleNamespace:
    return SimpleNamespace(to_state=state, created_at=T0 + timedelta(seconds=seconds))


def test_a_trials_runtime_is_its_running_time_while_its_sweep_ran():
    trial = [row(TrialState.PENDING, 0), row(TrialState.RUNNING, 10)]  # running since 10 s, still
    sweep = [row(JobState.RUNNING, 0), row(JobState.QUEUED, 40), row(JobState.RUNNING, 70)]  # preempted 40-70 s
    assert trial_runtime_s(trial, sweep, T0 + timedelta(seconds=100)) == 30.0 + 30.0


def trial_event(trial: str, state: str, **fields) -> dict:
    return {"type": "trial", "trial": trial, "state": state, **fields}


def post_sweep(client, sweep_id: str, token: str, *events: dict) -> None:
    answer = client.post(
        f"/internal/v1/sweeps/{sweep_id}/events", json={"attempt": 1, "events": list(events)}, headers=auth(token)
    )
    assert answer.status_code == 200, answer.text


def test_a_trial_past_its_deadline_is_told_to_stop_and_fails_deadline_exceeded(app, client, backend):
    body = {**SWEEP_BODY, "base": {**SWEEP_BODY["base"], "max_runtime_s": 60}}
    sweep_id, token = running(app, client, backend, "sweeps", **body)
    post_sweep(client, sweep_id, token, trial_event("t1", "running", config={"lr.base": 0.1}))
    # t1 has run 61 s (its history and its sweep's moved back); t2 starts now.
    with app.state.service.sessions.begin() as session:
        (trial_id,) = session.scalars(select(Trial.id).where(Trial.sweep_id == sweep_id))
    age_history(app, TrialEvent, TrialEvent.trial_id, trial_id, 61)
    age_history(app, SweepEvent, SweepEvent.sweep_id, sweep_id, 61)
    post_sweep(client, sweep_id, token, trial_event("t2", "running", config={"lr.base": 0.2}))

    control = client.get(f"/internal/v1/sweeps/{sweep_id}/control", params={"attempt": 1}, headers=auth(token))
    assert control.status_code == 200, control.text
    assert control.json()["stop_trials"] == ["t1"] and control.json()["checkpoint_now"] is False

    # The driver reports the trial's end as Tune saw it (classify_trial_error): FAILED deadline_exceeded; the
    # sweep runs on, and t1 is no longer listed.
    message = "trial t1 ran past its max_runtime_s: checkpointed at step 40 and stopped"
    post_sweep(client, sweep_id, token, trial_event("t1", "failed", message=message, reason="deadline_exceeded"))
    trials = client.get(f"/v1/sweeps/{sweep_id}/trials", headers=auth(ADMIN)).json()
    trials = trials["items"] if isinstance(trials, dict) else trials
    t1 = next(t for t in trials if t["tune_id"] == "t1")
    assert (t1["state"], t1["reason"]) == ("FAILED", "deadline_exceeded"), t1
    assert client.get(f"/v1/sweeps/{sweep_id}", headers=auth(ADMIN)).json()["state"] == "RUNNING"
    control = client.get(f"/internal/v1/sweeps/{sweep_id}/control", params={"attempt": 1}, headers=auth(token))
    assert control.json()["stop_trials"] == []


def test_without_a_trial_deadline_no_trial_is_listed(app, client, backend):
    sweep_id, token = running(app, client, backend, "sweeps", **SWEEP_BODY)
    post_sweep(client, sweep_id, token, trial_event("t1", "running", config={"lr.base": 0.1}))
    age_history(app, SweepEvent, SweepEvent.sweep_id, sweep_id, 10_000)
    control = client.get(f"/internal/v1/sweeps/{sweep_id}/control", params={"attempt": 1}, headers=auth(token))
    assert control.json()["stop_trials"] == []


class StopTrials(JsonHandler):
    stop: list[str] = []

    def do_GET(self):
        self.answer({"checkpoint_now": False, "stop_trials": self.stop})


@pytest.fixture
def control_plane():
    with serving(StopTrials) as url:
        yield url


def wait_for(condition, seconds: float = 10) -> bool:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)
    return condition()


def test_a_trials_rank_0_hears_its_own_deadline_and_no_other_trials(control_plane):
    StopTrials.stop = ["t2"]
    poller = ControlPoller(control_plane, "s1", 1, "stk_x", 0.05, collection="sweeps", preemption=False, trial="t1")
    try:
        time.sleep(0.3)
        assert not poller.checkpoint_now  # another trial's deadline
        StopTrials.stop = ["t2", "t1"]
        assert wait_for(lambda: poller.checkpoint_now)
        assert poller.deadline
    finally:
        poller.close()
    assert stopped(40, poller) == {PREEMPTED_KEY: 40, DEADLINE_KEY: True}
    assert stopped(40, None) == {PREEMPTED_KEY: 40}


def test_a_trial_polls_for_its_deadline_even_in_a_sweep_that_cannot_be_preempted(control_plane):
    sweep = {"url": control_plane, "sweep_id": "s1", "attempt": 1, "token": "stk_x", "markers": "/tmp/m"}
    no_hangs = {"failure": {"hang_timeout_s": None}}  # else every rank polls for its stacks (test_trial_hangs.py)
    config = {
        "spec": {"max_runtime_s": 60, **no_hangs},
        "sweep_control": {**sweep, "preemptible": False, "trial": "t1"},
    }
    poller = control_poller(config, 0)
    assert poller is not None and poller._trial == "t1" and not poller._preemption
    poller.close()
    assert control_poller(config, 1) is None  # rank 0 alone
    no_deadline = {"spec": no_hangs, "sweep_control": {**sweep, "preemptible": False, "trial": "t1"}}
    assert control_poller(no_deadline, 0) is None


def test_a_train_run_stopped_at_its_deadline_fails_the_trial_deadline_exceeded():
    from workers.tune.tuner import _pause_if_preempted

    result = SimpleNamespace(return_value={PREEMPTED_KEY: 40, DEADLINE_KEY: True}, metrics={})
    with pytest.raises(TrialDeadlineExceeded) as raised:
        _pause_if_preempted(result, {"trial": "t1"}, "t1")
    assert "checkpointed at step 40" in str(raised.value)
    assert classify_trial_error(raised.value) == "deadline_exceeded"


def test_a_failed_trials_error_is_read_from_its_local_folder(tmp_path):
    """Tune calls on_trial_error before the trial's error file reaches storage, where get_pickled_error() looks:
    every failed trial used to be reported with the message "None" and the default reason."""
    import cloudpickle
    from ray.exceptions import RayTaskError

    from workers.tune.tuner import trial_error

    cause = TrialDeadlineExceeded("trial t1 ran past its max_runtime_s")
    raised = RayTaskError("train", "Traceback: TrialDeadlineExceeded: trial t1 ran past its max_runtime_s", cause)
    (tmp_path / "error.pkl").write_bytes(cloudpickle.dumps(raised))
    (tmp_path / "error.txt").write_text("Failure # 1\nTrialDeadlineExceeded: trial t1 ran past its max_runtime_s\n")
    nothing_in_storage = {"get_pickled_error": lambda: None, "get_error": lambda: None, "trial_id": "t1"}
    trial = SimpleNamespace(
        pickled_error_file=str(tmp_path / "error.pkl"), error_file=str(tmp_path / "error.txt"), **nothing_in_storage
    )
    error = trial_error(trial)
    assert classify_trial_error(error) == "deadline_exceeded" and "ran past" in str(error)
    text_only = SimpleNamespace(pickled_error_file=None, error_file=str(tmp_path / "error.txt"), **nothing_in_storage)
    assert "ran past its max_runtime_s" in str(trial_error(text_only))
