"""Goodput, docs/jobs.md "Goodput": held time, kept training time and the rest by cause, from a job's state
history, its checkpoints and when its reports arrived; and ``GET /v1/jobs/{id}/goodput`` on the fake cluster."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest

from orchestrator.db.models import JobState
from orchestrator.services.goodput import measure
from tests.unit.api_helpers import ADMIN, auth
from tests.unit.test_deadlines import running
from tests.unit.test_hangs import HUNG_SPEC, age, metric, post, reconcile, stacks_of, wanted

S = JobState
T0 = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass
class Row:
    to_state: JobState
    at_s: float
    reason: str = ""
    attempt: int = 1

    @property
    def created_at(self) -> datetime:
        return T0 + timedelta(seconds=self.at_s)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_a_worker_restart_costs_its_restart_and_the_training_since_the_last_checkpoint():
    history = [
        Row(S.QUEUED, 0, "submitted", 0),
        Row(S.STARTING, 10, "admitted"),  # 10 s queued: not held
        Row(S.RUNNING, 20, "training_started"),
        Row(S.RESTARTING, 70, "worker_died"),  # the last checkpoint came at 50: 20 s redone
        Row(S.RUNNING, 75, "training_started"),
        Row(S.SUCCEEDED, 100, "completed"),
    ]
    measured = measure(history, [at(50), at(90)], {1: at(95)}, now=at(1000))
    assert (measured.held_s, measured.running_s) == (90.0, 75.0)
    assert (measured.start_up_s, measured.restarts_s, measured.recomputed_s) == (10.0, 5.0, 20.0)
    assert (measured.hangs_s, measured.preemption_s) == (0.0, 0.0)
    assert measured.kept_s == 55.0 and measured.goodput == pytest.approx(55 / 90)


def test_a_hang_costs_the_silence_and_the_training_before_it_since_the_checkpoint():
    history = [
        Row(S.QUEUED, 0, "submitted", 0),
        Row(S.STARTING, 0, "admitted"),
        Row(S.RUNNING, 10, "training_started"),
        Row(S.RUNNING, 60, "hang_suspected"),  # a request: the stretch goes on
        Row(S.RESTARTING, 70, "hung"),  # last report at 40, last checkpoint at 30
        Row(S.RUNNING, 80, "training_started", 2),
        Row(S.SUCCEEDED, 110, "completed", 2),
    ]
    measured = measure(history, [at(30), at(100)], {1: at(40), 2: at(105)}, now=at(1000))
    assert (measured.hangs_s, measured.recomputed_s, measured.restarts_s) == (30.0, 10.0, 10.0)
    assert measured.running_s == 90.0 and measured.kept_s == 50.0 and measured.held_s == 110.0


def test_a_preemption_costs_its_stop_and_nothing_is_redone_when_it_checkpointed_queued_time_is_not_held():
    history = [
        Row(S.QUEUED, 0, "submitted", 0),
        Row(S.STARTING, 0, "admitted"),
        Row(S.RUNNING, 5, "training_started"),
        Row(S.RUNNING, 60, "preempting"),
        Row(S.QUEUED, 65, "preempted"),  # its stop checkpoint at 62
        Row(S.STARTING, 500, "admitted", 2),
        Row(S.RUNNING, 505, "training_started", 2),
    ]
    measured = measure(history, [at(30), at(62)], {1: at(62), 2: at(520)}, now=at(525))  # still running
    assert (measured.preemption_s, measured.recomputed_s) == (5.0, 0.0)
    assert measured.held_s == 90.0 and measured.start_up_s == 10.0 and measured.running_s == 80.0
    assert measured.kept_s == 75.0 and measured.goodput == pytest.approx(75 / 90)


def test_a_stop_that_never_checkpointed_redoes_the_training_before_the_ask():
    history = [
        Row(S.QUEUED, 0, "submitted", 0),
        Row(S.STARTING, 0, "admitted"),
        Row(S.RUNNING, 0, "training_started"),
        Row(S.RUNNING, 40, "deadline_reached"),
        Row(S.FAILED, 100, "deadline_exceeded"),  # stopped after the grace, its last checkpoint at 25
    ]
    measured = measure(history, [at(25)], {1: at(39)}, now=at(1000))
    assert (measured.preemption_s, measured.recomputed_s, measured.kept_s) == (60.0, 15.0, 25.0)


def test_checkpoint_blocking_counts_in_the_kept_part_only_and_where_its_point_arrived():
    history = [
        Row(S.QUEUED, 0, "submitted", 0),
        Row(S.STARTING, 0, "admitted"),
        Row(S.RUNNING, 10, "training_started"),
        Row(S.RESTARTING, 70, "worker_died"),  # the last checkpoint at 50: 20 s redone
        Row(S.RUNNING, 75, "training_started", 2),
        Row(S.SUCCEEDED, 100, "completed", 2),
    ]
    # Points that carried checkpoint blocking: 2 s at 30 and 3 s at 50 (kept), 4 s at 60 (after the last checkpoint:
    # already lost as recomputed, not twice), 1 s at 99 in attempt 2.
    blocked = [(at(30), 2.0), (at(50), 3.0), (at(60), 4.0), (at(99), 1.0)]
    measured = measure(history, [at(50), at(90)], {1: at(60), 2: at(99)}, now=at(1000), blocked=blocked)
    assert measured.checkpoint_blocking_s == 6.0 and measured.recomputed_s == 20.0
    assert measured.kept_s == 85.0 - 20.0 - 6.0
    windowed = measure(history, [at(50), at(90)], {}, now=at(1000), window=(at(40), at(100)), blocked=blocked)
    assert windowed.checkpoint_blocking_s == 4.0  # 3 s at 50, 1 s at 99; the one at 30 is outside


def test_nothing_held_yet_has_no_goodput():
    measured = measure([Row(S.QUEUED, 0, "submitted", 0)], [], {}, now=at(100))
    assert (measured.held_s, measured.goodput) == (0.0, None)


def test_the_goodput_route_of_a_job_that_hung(app, client, backend):
    job_id, token = running(app, client, backend, **HUNG_SPEC)
    post(client, job_id, token, 1, metric(1))
    age(app, job_id, 30)  # 30 s of silence after its report
    reconcile(app)
    request = wanted(client, job_id, token, 1)
    for rank in (0, 1):
        post(client, job_id, token, 1, stacks_of(rank, request, rank == 1))
    reconcile(app)  # ended hung: RESTARTING, attempt 2

    answer = client.get(f"/v1/jobs/{job_id}/goodput", headers=auth(ADMIN))
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["lost"]["hangs_s"] == pytest.approx(30.0, abs=5.0), body  # 30 s ago, and a moment more
    # It ran only between its running report and its metric (two requests; seconds on a loaded CI machine), not 30 s.
    assert body["lost"]["recomputed_s"] == pytest.approx(0.0, abs=3.0), body
    assert 0.0 <= body["goodput"] < 0.1 and body["held_s"] >= body["running_s"] >= 30.0, body
    assert set(body["lost"]) == {
        "start_up_s",
        "restarts_s",
        "hangs_s",
        "recomputed_s",
        "preemption_s",
        "checkpoint_blocking_s",
    }
    assert client.get("/v1/jobs/nope/goodput", headers=auth(ADMIN)).status_code == 404


def test_the_checkpoint_blocking_a_run_reports_is_lost_time_of_its_goodput(app, client, backend):
    """Through the events route: the seconds on a metric point are stored with it and counted, a retried point
    does not count them twice, and a negative figure is a 422."""
    job_id, token = running(app, client, backend)
    blocked = {**metric(1), "checkpoint_blocked_s": 1.5}
    post(client, job_id, token, 1, blocked)
    post(client, job_id, token, 1, blocked)  # a retried batch
    post(client, job_id, token, 1, {**metric(2), "checkpoint_blocked_s": 0.5})
    body = client.get(f"/v1/jobs/{job_id}/goodput", headers=auth(ADMIN)).json()
    assert body["lost"]["checkpoint_blocking_s"] == pytest.approx(2.0), body
    assert body["kept_s"] == pytest.approx(max(body["running_s"] - 2.0, 0.0), abs=0.5), body
    bad = client.post(
        f"/internal/v1/jobs/{job_id}/events",
        json={"attempt": 1, "events": [{**metric(3), "checkpoint_blocked_s": -1}]},
        headers=auth(token),
    )
    assert bad.status_code == 422, bad.text
