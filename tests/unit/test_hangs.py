"""Hang detection, docs/jobs.md "Hangs": the hang timeout ("auto" from the run's own report intervals), the
control plane's flow on the fake cluster (suspect, ask every rank for its stack, judge: a new attempt, then FAILED
``hung``; progress meanwhile clears it), the bounds of what a rank may send, the 422s, and the rank's side (where
its training thread is, its answer to the control plane's poll). The real cluster: tests/integration/
test_hangs_on_ray.py."""

from __future__ import annotations

import re
import threading
import time
import traceback
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
from sqlalchemy import select

from orchestrator.backend import RunStatus
from orchestrator.db.models import Job, JobEvent, JobMetric
from orchestrator.loops.reconciler import Reconciler
from orchestrator.services.hangs import STARTUP_FACTOR, timeout_s
from tests.unit.api_helpers import ADMIN, auth, run_token, submit
from tests.unit.api_helpers import reconcile as reconcile_just_started
from tests.unit.http_stub import JsonHandler, serving
from tests.unit.test_deadlines import job_events, running
from workers.runtime import stacks
from workers.runtime.control import ControlPoller

T0 = datetime(2026, 1, 1, tzinfo=UTC)
FLOOR_S = 300.0
WAIT_S = 20.0


def job_with(failure: dict | None) -> SimpleNamespace:
    return SimpleNamespace(spec={} if failure is None else {"failure": failure})


def at(*seconds: float) -> list[datetime]:
    return [T0 + timedelta(seconds=s) for s in seconds]


def test_auto_is_the_floor_20_median_intervals_or_twice_the_longest_gap():
    auto = job_with({"hang_timeout_s": "auto"})
    # No report yet in this attempt: start-up has no median, it gets several floors.
    assert timeout_s(auto, [], T0, FLOOR_S) == STARTUP_FACTOR * FLOOR_S
    # Reports every second: the floor.
    assert timeout_s(auto, at(10, 11, 12, 13), T0, FLOOR_S) == FLOOR_S
    # Reports every 30 s: 20 of them.
    assert timeout_s(auto, at(30, 60, 90, 120), T0, FLOOR_S) == 600.0
    # A checkpoint that took 250 s between 1-second reports: twice the longest gap.
    assert timeout_s(auto, at(10, 11, 261, 262, 263), T0, FLOOR_S) == 500.0
    # A start-up of 400 s (the first gap) counts as a long gap too.
    assert timeout_s(auto, at(400, 401, 402), T0, FLOOR_S) == 800.0
    # A spec stored before hang detection: auto. A number: that. null: off.
    assert timeout_s(job_with(None), at(10, 11), T0, FLOOR_S) == FLOOR_S
    assert timeout_s(job_with({"hang_timeout_s": 8}), at(10, 11), T0, FLOOR_S) == 8.0
    assert timeout_s(job_with({"hang_timeout_s": None}), at(10, 11), T0, FLOOR_S) is None


@pytest.fixture
def settings_overrides() -> dict:
    return {"hang_stacks_wait_s": WAIT_S}


HUNG_SPEC = {"failure": {"hang_timeout_s": 10}, "retries": {"max_attempts": 2}, "scaling": {"num_workers": 2}}


def reconcile(app) -> None:
    """A reconciler of a control plane that has run for a day: silence counts from before this test's ``age``."""
    service = app.state.service
    reconciler = Reconciler(service.sessions, service.backend, service.settings)
    reconciler.watching_since -= timedelta(days=1)
    reconciler.tick()


def age(app, job_id: str, seconds: float) -> None:
    """Move the job's history and metric points ``seconds`` into the past, and its stack request if any: as if
    that much time had gone by since."""
    with app.state.service.sessions.begin() as session:
        for model in (JobEvent, JobMetric):
            for row in session.scalars(select(model).where(model.job_id == job_id)):
                row.created_at -= timedelta(seconds=seconds)
        job = session.get(Job, job_id)
        if job.stacks_requested_at is not None:
            job.stacks_requested_at -= timedelta(seconds=seconds)


def post(client, job_id: str, token: str, attempt: int, *events: dict) -> dict:
    response = client.post(
        f"/internal/v1/jobs/{job_id}/events", json={"attempt": attempt, "events": list(events)}, headers=auth(token)
    )
    assert response.status_code == 200, response.text
    return response.json()


def metric(step: int) -> dict:
    return {"type": "metrics", "epoch": 0, "step": step, "values": {"loss": 1.0}}


def stacks_of(rank: int, request: str, in_collective: bool, where: str = "") -> dict:
    return {
        "type": "stacks",
        "request": request,
        "rank": rank,
        "node": f"node-{rank}",
        "pid": 100 + rank,
        "in_collective": in_collective,
        "where": where,
        "stacks": f'Thread "train" (training):\n  File "train.py", line 9, in main\n    {where or "wait()"}\n',
    }


def wanted(client, job_id: str, token: str, attempt: int) -> str | None:
    signal = client.get(f"/internal/v1/jobs/{job_id}/control", params={"attempt": attempt}, headers=auth(token))
    return signal.json()["stacks_wanted"]


def job(client, job_id: str) -> dict:
    return client.get(f"/v1/jobs/{job_id}", headers=auth(ADMIN)).json()


def test_a_job_without_progress_gives_its_stacks_restarts_hung_then_fails_hung(app, client, backend):
    job_id, token = running(app, client, backend, **HUNG_SPEC)
    post(client, job_id, token, 1, metric(1))
    reconcile(app)  # progress just now: nothing asked
    assert wanted(client, job_id, token, 1) is None

    age(app, job_id, 11)
    reconcile(app)
    body = job(client, job_id)
    assert (body["state"], body["reason"]) == ("RUNNING", "hang_suspected"), body
    # 11 s ago, and a moment more on a busy machine
    assert re.search(r"no progress for 1[1-4] s \(its hang timeout is 10 s\)", body["message"]), body["message"]
    request = wanted(client, job_id, token, 1)
    assert request
    # A stale request's answer, and a rank the job does not have, are not kept.
    assert post(client, job_id, token, 1, stacks_of(0, "an-old-request", False))["applied"] == 0
    assert post(client, job_id, token, 1, stacks_of(7, request, False))["applied"] == 0
    assert post(client, job_id, token, 1, stacks_of(1, request, True))["applied"] == 1
    reconcile(app)  # one rank of two answered, within the wait: still waiting
    assert job(client, job_id)["state"] == "RUNNING" and backend.stopped == []

    assert post(client, job_id, token, 1, stacks_of(0, request, False, "train.py:9 in main: time.sleep(3600)"))
    reconcile(app)
    body = job(client, job_id)
    assert (body["state"], body["reason"], body["attempt"]) == ("RESTARTING", "hung", 2), body
    assert backend.stopped == [f"{job_id}-1"] and backend.submitted[-1][0] == f"{job_id}-2"
    message = body["message"]
    assert re.search(r"hung: no progress for 1[1-4] s \(last reported step 1\)", message), message
    assert "in a collective (waiting for the others): rank 1 (node node-1, pid 101)" in message, message
    assert "elsewhere: rank 0 (node node-0, pid 100) at train.py:9 in main: time.sleep(3600)" in message, message
    assert "--- rank 0's stack ---" in message and "starting attempt 2 of 2" in message, message

    # Attempt 2 hangs as well, and its ranks never answer: judged after the wait, and no attempts are left.
    token = run_token(client, backend)
    post(client, job_id, token, 2, {"type": "state", "state": "running"})
    backend.runs[f"{job_id}-2"] = RunStatus.RUNNING
    assert wanted(client, job_id, token, 2) is None  # the new attempt starts with no request
    age(app, job_id, 11)  # no report at all in this attempt: an explicit timeout has no start-up allowance
    reconcile(app)
    assert job(client, job_id)["reason"] == "hang_suspected"
    age(app, job_id, WAIT_S + 1)
    reconcile(app)
    body = job(client, job_id)
    assert (body["state"], body["reason"], body["attempt"]) == ("FAILED", "hung", 2), body
    assert "no stack from rank 0, 1 (its process is gone, or holds the GIL)" in body["message"], body["message"]
    assert "attempt 2 of 2: none left" in body["message"], body["message"]
    assert backend.stopped == [f"{job_id}-1", f"{job_id}-2"]
    reasons = [reason for _state, reason in job_events(client, job_id)]
    assert reasons.count("hang_suspected") == 2 and reasons.count("hung") == 2, reasons


def test_progress_after_the_request_clears_the_suspicion(app, client, backend):
    job_id, token = running(app, client, backend, **HUNG_SPEC)
    post(client, job_id, token, 1, metric(1))
    age(app, job_id, 11)
    reconcile(app)
    assert wanted(client, job_id, token, 1)
    post(client, job_id, token, 1, metric(2))  # a slow step, not a hang
    reconcile(app)
    body = job(client, job_id)
    assert (body["state"], body["reason"], body["attempt"]) == ("RUNNING", "progress_resumed", 1), body
    assert wanted(client, job_id, token, 1) is None and backend.stopped == []


def test_a_control_plane_just_started_counts_silence_from_its_start(app, client, backend):
    """While no control plane ran, the ranks' reports waited in their buffers: a control plane that comes back
    does not judge a job on the silence before it started."""
    job_id, token = running(app, client, backend, **HUNG_SPEC)
    post(client, job_id, token, 1, metric(1))
    age(app, job_id, 3600)
    reconcile_just_started(app)
    assert (job(client, job_id)["reason"], wanted(client, job_id, token, 1)) == ("training_started", None)
    reconcile(app)  # the same silence, seen by a control plane that was running all along
    assert job(client, job_id)["reason"] == "hang_suspected"


def test_null_turns_it_off(app, client, backend):
    job_id, token = running(app, client, backend, failure={"hang_timeout_s": None})
    post(client, job_id, token, 1, metric(1))
    age(app, job_id, 365 * 24 * 3600)
    reconcile(app)
    assert (job(client, job_id)["state"], job(client, job_id)["reason"]) == ("RUNNING", "training_started")


@pytest.mark.parametrize("value", [0, -5, "10", "soon", True, 10**9])
def test_a_bad_hang_timeout_is_422_saying_what_to_give(client, value):
    response = submit(client, ADMIN, failure={"hang_timeout_s": value})
    assert response.status_code == 422, response.text
    assert "hang_timeout_s" in response.text


# --- the rank's side -----------------------------------------------------------------------------------------


def frame(filename: str, line: str, name: str = "f") -> traceback.FrameSummary:
    return traceback.FrameSummary(filename, 7, name, line=line)


LIB = "/venv/lib/python3.11/site-packages"


def test_where_a_rank_is_its_innermost_own_frame_and_in_a_collective_by_the_library_frames_inside():
    outer = [frame(f"{LIB}/ray/train/v2/_internal/thread_runner.py", "fn()"), frame("/job/train.py", "step()", "main")]
    asleep = [*outer, frame("/job/train.py", "time.sleep(3600)", "step")]
    assert stacks.place(asleep) == (False, "train.py:7 in step: time.sleep(3600)")
    reducing = [*outer, frame(f"{LIB}/torch/distributed/distributed_c10d.py", "work.wait()", "all_reduce")]
    assert stacks.place(reducing) == (True, "train.py:7 in main: step()")
    backward = [*outer, frame(f"{LIB}/torch/autograd/graph.py", "run_backward()", "_engine_run_backward")]
    assert stacks.place(backward)[0] is True
    # Ray Train's report is a barrier: waiting in it (down in the standard library) is waiting for the others.
    reporting = [*outer, frame(f"{LIB}/ray/train/v2/api/train_fn_utils.py", "q.get()"), frame(threading.__file__, "x")]
    assert stacks.place(reporting)[0] is True
    # A data loader's queue, or any other library, is not a collective.
    loading = [*outer, frame(f"{LIB}/torch/utils/data/dataloader.py", "self._get_data()")]
    assert stacks.place(loading) == (False, "train.py:7 in main: step()")


def test_a_rank_answers_a_request_once_with_its_training_threads_stack():
    """A ControlPoller made on a thread that then sleeps, polling a tiny control plane: it posts one StacksEvent per
    request (the training thread's place and every thread's stack) and prints it to stderr."""
    posted: list[dict] = []
    requests = ["r1"]

    class ControlPlane(JsonHandler):
        def do_GET(self):
            self.answer({"checkpoint_now": False, "stacks_wanted": requests[-1]})

        def do_POST(self):
            posted.append(self.body())
            self.answer({"received": 1, "applied": 1})

    made: list[ControlPoller] = []
    with serving(ControlPlane) as url:
        release = threading.Event()

        def training() -> None:
            made.append(ControlPoller(url, "j1", 3, "jtk_x", 0.05, preemption=False, stacks_rank=1))
            release.wait(30)  # "hung" here, in the standard library's wait

        trainer = threading.Thread(target=training, name="training")
        trainer.start()
        try:
            deadline = time.monotonic() + 20
            while len(posted) < 1 and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.3)  # more polls of the same request: no second answer
            assert len(posted) == 1, posted
            requests.append("r2")
            while len(posted) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            release.set()
            trainer.join()
            made[0].close()
    first, second = posted
    assert first["attempt"] == 3 and [e["request"] for e in (first["events"][0], second["events"][0])] == ["r1", "r2"]
    event = first["events"][0]
    assert (event["type"], event["rank"], event["in_collective"]) == ("stacks", 1, False)
    assert event["where"].startswith("test_hangs.py:") and "release.wait(30)" in event["where"], event["where"]
    assert event["stacks"].startswith('Thread "training" (training):'), event["stacks"][:200]
    assert not made[0].checkpoint_now
