"""Hang detection in a sweep's trials (its base's ``failure.hang_timeout_s``; docs/jobs.md "Hangs"): the control
plane suspects a trial without progress, asks its ranks for their stacks through the sweep's control signal
(``trial_stacks_wanted``), judges it (a ``hung`` row naming the ranks' places) and names its workers in
``end_workers``; a trial that then fails without progress since fails ``hung``; progress meanwhile clears it. The
control plane on the fake cluster; a trial rank's side with a tiny control plane over HTTP (the real cluster:
tests/integration/test_sweeps_on_ray.py)."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from sqlalchemy import select

from orchestrator.db.models import SweepEvent, Trial, TrialEvent, TrialMetric
from tests.unit.api_helpers import ADMIN, auth
from tests.unit.http_stub import JsonHandler, serving
from tests.unit.test_deadlines import SWEEP_BODY, running
from tests.unit.test_hangs import reconcile, stacks_of
from tests.unit.test_trial_deadlines import post_sweep, trial_event, wait_for
from workers.runtime import control as control_module
from workers.runtime.control import HUNG_EXIT_CODE, control_poller

WAIT_S = 20.0
TWO_RANKS = {**SWEEP_BODY["base"], "scaling": {"num_workers": 2, "cpus_per_worker": 1}}


@pytest.fixture
def settings_overrides() -> dict:
    return {"hang_stacks_wait_s": WAIT_S}


def hung_sweep(app, client, backend, hang_timeout_s=30) -> tuple[str, str, str]:
    """A running sweep whose trial t1 reported epoch 1 and then nothing for 60 s: ``(sweep, token, trial id)``."""
    base = {**TWO_RANKS, "failure": {"hang_timeout_s": hang_timeout_s}}
    sweep_id, token = running(app, client, backend, "sweeps", **{**SWEEP_BODY, "base": base})
    post_sweep(client, sweep_id, token, trial_event("t1", "running", config={"lr.base": 0.1}))
    post_sweep(client, sweep_id, token, trial_event("t1", "running", epoch=1, step=10, metrics={"val_loss": 1.0}))
    with app.state.service.sessions.begin() as session:
        (trial_id,) = session.scalars(select(Trial.id).where(Trial.sweep_id == sweep_id))
    age(app, sweep_id, trial_id, 60)
    return sweep_id, token, trial_id


def age(app, sweep_id: str, trial_id: str, seconds: float) -> None:
    """Move the sweep's and the trial's history, the trial's epochs, start and requests ``seconds`` back."""
    with app.state.service.sessions.begin() as session:
        for model, column, key in (
            (SweepEvent, SweepEvent.sweep_id, sweep_id),
            (TrialEvent, TrialEvent.trial_id, trial_id),
            (TrialMetric, TrialMetric.trial_id, trial_id),
        ):
            for row in session.scalars(select(model).where(column == key)):
                row.created_at -= timedelta(seconds=seconds)
        trial = session.get(Trial, trial_id)
        for field in ("started_at", "progress_at", "stacks_requested_at", "hung_at"):
            if getattr(trial, field) is not None:
                setattr(trial, field, getattr(trial, field) - timedelta(seconds=seconds))


def control(client, sweep_id: str, token: str) -> dict:
    answer = client.get(f"/internal/v1/sweeps/{sweep_id}/control", params={"attempt": 1}, headers=auth(token))
    assert answer.status_code == 200, answer.text
    return answer.json()


def trial_of(client, sweep_id: str) -> dict:
    trials = client.get(f"/v1/sweeps/{sweep_id}/trials", headers=auth(ADMIN)).json()
    return (trials["items"] if isinstance(trials, dict) else trials)[0]


def stacks(request: str, rank: int, worker: str, in_collective: bool, where: str = "") -> dict:
    """A trial rank's answer: a job rank's (``stacks_of``) with its trial and its worker process's id."""
    return {**stacks_of(rank, request, in_collective, where), "trial": "t1", "worker": worker}


def test_a_trial_without_progress_is_asked_for_stacks_judged_hung_and_its_workers_ended(app, client, backend):
    sweep_id, token, _ = hung_sweep(app, client, backend)
    assert control(client, sweep_id, token)["trial_stacks_wanted"] == {}
    reconcile(app)
    assert trial_of(client, sweep_id)["reason"] == "hang_suspected"
    request = control(client, sweep_id, token)["trial_stacks_wanted"]["t1"]

    # Rank 1 sleeps in its own code, rank 0 waits for it in a collective; an answer to an old request, or from a
    # rank the trial does not have, is not kept.
    post_sweep(client, sweep_id, token, stacks("an old request", 1, "w-old", False))
    post_sweep(client, sweep_id, token, stacks(request, 5, "w-5", False))
    reconcile(app)
    assert trial_of(client, sweep_id)["reason"] == "hang_suspected"  # waiting for its ranks' answers
    post_sweep(client, sweep_id, token, stacks(request, 0, "w-0", True))
    post_sweep(client, sweep_id, token, stacks(request, 1, "w-1", False, "train.py:9 in step: time.sleep(3600)"))
    reconcile(app)
    trial = trial_of(client, sweep_id)
    assert (trial["state"], trial["reason"]) == ("RUNNING", "hung"), trial
    assert "in a collective (waiting for the others): rank 0 (node node-0" in trial["message"]
    assert "rank 1 (node node-1, pid 101) at train.py:9 in step: time.sleep(3600)" in trial["message"]
    assert "last reported epoch 1" in trial["message"] and "Ray Train restarts them" in trial["message"]
    signal = control(client, sweep_id, token)
    assert sorted(signal["end_workers"]) == ["w-0", "w-1"] and signal["trial_stacks_wanted"] == {}

    # Ray Train restarted the workers, and the trial hung again until its restarts ran out: it fails hung.
    post_sweep(client, sweep_id, token, trial_event("t1", "failed", message="WorkerGroupError", reason="worker_died"))
    trial = trial_of(client, sweep_id)
    assert (trial["state"], trial["reason"]) == ("FAILED", "hung"), trial
    assert "time.sleep(3600)" in trial["message"] and "WorkerGroupError" in trial["message"]


def test_a_trial_that_reports_after_its_stacks_were_asked_for_is_not_hung(app, client, backend):
    sweep_id, token, _ = hung_sweep(app, client, backend)
    reconcile(app)
    request = control(client, sweep_id, token)["trial_stacks_wanted"]["t1"]
    post_sweep(client, sweep_id, token, stacks(request, 0, "w-0", True))
    # A later step of the same epoch (a training function reports many times an epoch): one merged metric point,
    # but progress all the same.
    post_sweep(client, sweep_id, token, trial_event("t1", "running", epoch=1, step=20, metrics={"val_loss": 0.9}))
    reconcile(app)
    trial = trial_of(client, sweep_id)
    assert (trial["state"], trial["reason"]) == ("RUNNING", "progress_resumed"), trial
    assert control(client, sweep_id, token) | {"stop_trials": []} == {
        "checkpoint_now": False,
        "stacks_wanted": None,
        "stop_trials": [],
        "trial_stacks_wanted": {},
        "end_workers": [],  # its answering worker goes on
    }
    # A trial that fails after progress keeps the driver's reason.
    post_sweep(client, sweep_id, token, trial_event("t1", "failed", message="boom", reason="code_error"))
    assert trial_of(client, sweep_id)["reason"] == "code_error"


def test_no_answer_ends_no_worker_and_a_failure_keeps_its_reason(app, client, backend):
    """No rank answered within the wait (its workers are gone or paused, or hold the GIL): a ``hung`` row says so,
    but no worker is named and a later failure is not blamed on the hang."""
    sweep_id, token, trial_id = hung_sweep(app, client, backend)
    reconcile(app)
    with app.state.service.sessions.begin() as session:
        session.get(Trial, trial_id).stacks_requested_at -= timedelta(seconds=WAIT_S + 1)
    reconcile(app)
    trial = trial_of(client, sweep_id)
    assert trial["reason"] == "hung" and "no rank answered" in trial["message"], trial
    assert control(client, sweep_id, token)["end_workers"] == []
    post_sweep(client, sweep_id, token, trial_event("t1", "failed", message="boom", reason="worker_died"))
    assert trial_of(client, sweep_id)["reason"] == "worker_died"


def test_null_turns_it_off_for_trials(app, client, backend):
    sweep_id, token, _ = hung_sweep(app, client, backend, hang_timeout_s=None)
    reconcile(app)
    assert trial_of(client, sweep_id)["reason"] == "started"
    assert control(client, sweep_id, token)["trial_stacks_wanted"] == {}


@pytest.mark.parametrize("value", [0, -5, "soon"])
def test_a_bad_trial_hang_timeout_is_422(client, value):
    body = {**SWEEP_BODY, "base": {**SWEEP_BODY["base"], "failure": {"hang_timeout_s": value}}}
    response = client.post("/v1/sweeps", json=body, headers=auth(ADMIN))
    assert response.status_code == 422, response.text
    assert "hang_timeout_s" in response.text


# --- a trial rank's side ---------------------------------------------------------------------------------------


class HungTrial(JsonHandler):
    signal: dict = {}
    posted: list = []

    def do_GET(self):
        self.answer(self.signal)

    def do_POST(self):
        self.posted.append(self.body())
        self.answer({"received": 1, "applied": 1})


@pytest.fixture
def sweep_control_plane():
    HungTrial.signal, HungTrial.posted = {}, []
    with serving(HungTrial) as url:
        yield url


def trial_config(url: str, failure: dict | None = None) -> dict:
    sweep = {"url": url, "sweep_id": "s1", "attempt": 1, "token": "stk_x", "markers": "/tmp/m", "trial": "t1"}
    return {"spec": {"failure": failure or {}}, "sweep_control": {**sweep, "preemptible": False}}


def test_every_rank_of_a_watched_trial_answers_its_trials_request_then_ends_when_named(
    sweep_control_plane, monkeypatch
):
    ended = threading.Event()
    codes: list[int] = []
    pollers = []

    def fake_exit(code: int) -> None:
        codes.append(code)
        ended.set()
        pollers[0]._stop.set()  # its polling ends, as the process would

    monkeypatch.setattr(control_module.os, "_exit", fake_exit)
    monkeypatch.setenv("ORCHESTRATOR_STACKS_POLL_S", "0.05")
    poller = control_poller(trial_config(sweep_control_plane), 1)  # not rank 0: polls for its stacks alone
    pollers.append(poller)
    assert poller is not None and not poller._preemption
    try:
        HungTrial.signal = {"trial_stacks_wanted": {"t2": "r-other"}}
        assert not wait_for(lambda: HungTrial.posted, 0.4)  # another trial's request
        HungTrial.signal = {"trial_stacks_wanted": {"t1": "r1"}}
        assert wait_for(lambda: HungTrial.posted)
        (answer,) = HungTrial.posted[0]["events"]
        assert (answer["trial"], answer["rank"], answer["request"], answer["worker"]) == ("t1", 1, "r1", poller.worker)
        HungTrial.signal = {"end_workers": ["someone-else"]}
        assert not ended.wait(0.4)
        HungTrial.signal = {"end_workers": [poller.worker]}
        assert ended.wait(10) and codes == [HUNG_EXIT_CODE]
    finally:
        poller.close()


def test_a_trial_with_hang_detection_off_polls_nothing_for_it(sweep_control_plane):
    assert control_poller(trial_config(sweep_control_plane, {"hang_timeout_s": None}), 1) is None
    watched = control_poller(trial_config(sweep_control_plane, {"hang_timeout_s": 30}), 1)
    assert watched is not None and watched._stacks_trial == "t1" and watched._stacks_rank == 1
    watched.close()
