"""Stragglers, docs/jobs.md "Stragglers": on 2 gloo ranks the loop measures each rank's own time per step (its
data and its forward pass) and rank 0 sends them with its metric windows; the control plane flags a rank slower
than ``failure.straggler_factor`` times the median for ``ORCHESTRATOR_STRAGGLER_WINDOWS`` windows in a row (the
fake cluster; the real one: tests/integration/test_hangs_on_ray.py)."""

from __future__ import annotations

import pytest

from orchestrator_contract.jobs import MetricsEvent
from tests.unit.api_helpers import ADMIN, submit
from tests.unit.harness import job_config, run_on_ranks, train
from tests.unit.test_deadlines import job_events, running
from tests.unit.test_hangs import job, post

SLOW = "example_workloads.faulty:build"


def slow_run(slow_s: float) -> dict:
    """The loop config of a 2-rank run whose rank 1 sleeps ``slow_s`` a training sample."""
    return job_config(
        SLOW,
        config={"slow_rank": 1, "slow_s": slow_s, "points": 256},
        batch={"per_worker": 8},
        epochs=1,
        metrics_every_steps=2,
    )


def test_the_loop_sends_each_ranks_own_time_and_the_slow_rank_shows(tmp_path):
    config = slow_run(0.005)  # 40 ms a step more on rank 1
    (rank0, _rank1) = run_on_ranks([(train, {"config": config, "root": tmp_path / "run"})], tmp_path)
    windows = [
        e["rank_step_s"] for e in rank0[0]["events"] if e.get("type") == "metrics" and e.get("rank_step_s") is not None
    ]
    assert len(windows) >= 5, rank0[0]["events"][:3]
    assert all(len(w) == 2 and w[1] >= 0.04 for w in windows), windows
    assert sum(w[1] > 1.5 * w[0] for w in windows) >= len(windows) - 1, windows


def test_one_rank_needs_no_times():
    event = MetricsEvent(epoch=1, step=2, values={"loss": 1.0})
    assert event.rank_step_s is None


def window(step: int, times: list[float]) -> dict:
    return {"type": "metrics", "epoch": 0, "step": step, "values": {"loss": 1.0}, "rank_step_s": times}


@pytest.fixture
def settings_overrides() -> dict:
    return {"straggler_windows": 3}


def test_a_rank_slow_three_windows_in_a_row_is_a_straggler_once(app, client, backend):
    job_id, token = running(app, client, backend, scaling={"num_workers": 3})
    post(client, job_id, token, 1, window(10, [0.1, 0.2, 0.1]), window(20, [0.1, 0.2, 0.1]))
    post(client, job_id, token, 1, window(30, [0.1, 0.1, 0.1]))  # a fast window: the count starts again
    post(client, job_id, token, 1, window(40, [0.1, 0.2, 0.1]), window(50, [0.1, 0.2, 0.1]))
    assert job(client, job_id)["stragglers"] is None
    post(client, job_id, token, 1, window(60, [0.1, 0.31, 0.1]))
    body = job(client, job_id)
    (straggler,) = body["stragglers"]
    assert (straggler["rank"], straggler["ratio"], straggler["step"]) == (1, 3.1, 60), straggler
    assert body["reason"] == "straggler" and "rank 1 is a straggler: 3.1x the other ranks' median" in body["message"]
    post(client, job_id, token, 1, window(70, [0.1, 0.3, 0.1]))  # still slow: no second row
    assert [r for _s, r in job_events(client, job_id)].count("straggler") == 1
    # Just under the factor (1.5) is not slow.
    post(client, job_id, token, 1, *(window(80 + i, [0.1, 0.1, 0.149]) for i in range(5)))
    assert [s["rank"] for s in job(client, job_id)["stragglers"]] == [1]


@pytest.mark.parametrize(
    "failure, what",
    [
        ({"straggler_factor": 1}, "greater than 1"),
        ({"straggler_factor": 0.5}, "greater than 1"),
        ({"on_straggler": "ignore"}, "on_straggler"),
    ],
)
def test_bad_straggler_settings_are_422(client, failure, what):
    response = submit(client, ADMIN, failure=failure)
    assert response.status_code == 422 and what in response.text, response.text
