"""Preemption that checkpoints first (docs/scheduling.md, "Preemption"), on the session's real Ray cluster (2 CPUs).

A low-priority job holds both CPUs; a job of higher priority in the same project is submitted and cannot
start. The scheduler preempts the low one: its training loop checkpoints at the next step and stops, its Ray
job ends, it goes back to QUEUED (``preempted``, naming the high one), the high one runs, and the low one is
admitted again, resumes from that checkpoint and SUCCEEDS with the final metrics of an uninterrupted run of
the same spec (the high-priority job is that run: the same spec and seed), no step missing, at most one
repeated, and its attempt budget untouched (``max_attempts: 1``, and still it succeeds).

A sweep is preempted the same way, whole (``workers.tune.preemption``): its running trial checkpoints at its
next step and pauses, Tune saves its state, the sweep goes back to QUEUED, and when admitted again Tune
resumes the paused trial from that checkpoint; the trial that had finished is kept, never run again.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

# The chaos tests' tolerances for exact resume (tests/chaos/recovery.py): room for floating-point noise only
# (one validation sample of accuracy, 1 % of the loss); every recovery measured matched to the last digit.
ACCURACY_TOLERANCE = 0.003
LOSS_TOLERANCE = 0.001

# digits, 2 workers of 4 (1 CPU each: the whole cluster), 179 steps an epoch, a metric point every step.
# Long enough that the victim is still training when the preemption reaches it: from the high job's submit
# to the victim's stop took 5-6 s and 100-120 of its steps here (bench/preemption.py), and once over 150.
SPEC = {
    "workload": "digits",
    "epochs": 2,
    "seed": 11,
    "scaling": {"num_workers": 2},
    "batch": {"per_worker": 4},
    "metrics_every_steps": 1,
    "checkpoint": {"every_epochs": None, "every_steps": 100, "keep": 2, "wait_for_commit": True},
    "retries": {"max_worker_restarts": 0, "max_attempts": 1},
}
TOTAL_STEPS = 2 * 179
PREEMPT_AFTER_STEP = 10


def metric_steps(api, job_id: str) -> dict[int, list[int]]:
    response = api.http.get(f"/v1/jobs/{job_id}/metrics")
    response.raise_for_status()
    by_attempt: dict[int, list[int]] = {}
    for point in response.json():
        by_attempt.setdefault(point["attempt"], []).append(point["step"])
    return {attempt: sorted(steps) for attempt, steps in sorted(by_attempt.items())}


def history(api, job_id: str) -> list[dict]:
    response = api.http.get(f"/v1/jobs/{job_id}/events")
    response.raise_for_status()
    return response.json()


def wait_for_step(api, job_id: str, step: int, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = api.job(job_id)
        if (job.get("latest_metrics") or {}).get("step", 0) >= step:
            return
        if job["state"] in {"SUCCEEDED", "FAILED", "CANCELLED"}:
            pytest.fail(f"job ended {job['state']} before step {step}: {job['message'][-2000:]}")
        time.sleep(0.2)
    pytest.fail(f"job {job_id} did not reach step {step} in {timeout_s} s: {api.job(job_id)}")


def test_a_high_priority_job_preempts_a_running_low_one_which_checkpoints_and_resumes_exactly(member):
    low = member.submit(**SPEC, name="preempt-low", priority=0)
    assert low.status_code == 201, low.text
    low_id = low.json()["id"]
    wait_for_step(member, low_id, PREEMPT_AFTER_STEP)

    high = member.submit(**SPEC, name="preempt-high", priority=10)
    assert high.status_code == 201, high.text
    high_id = high.json()["id"]

    # The low one is asked to checkpoint and stop, and goes back to the queue.
    deadline = time.monotonic() + 120
    while (low_now := member.job(low_id))["state"] != "QUEUED":
        if low_now["state"] in {"SUCCEEDED", "FAILED", "CANCELLED"} or time.monotonic() > deadline:
            high_now = member.job(high_id)
            pytest.fail(
                f"the low job is {low_now['state']} ({low_now['reason']}) at step "
                f"{(low_now.get('latest_metrics') or {}).get('step')}, never requeued; the high job is "
                f"{high_now['state']} ({high_now['reason']}: {high_now['message']})"
            )
        time.sleep(0.2)

    high_done = member.wait(high_id, {"SUCCEEDED"}, timeout_s=240)
    low_done = member.wait(low_id, {"SUCCEEDED"}, timeout_s=240)

    # The low one went back to the queue, preempted by the high one, and never failed or restarted.
    low_history = history(member, low_id)
    moves = [(e["from_state"], e["to_state"], e["reason"], e["attempt"]) for e in low_history]
    requeued = [e for e in low_history if e["to_state"] == "QUEUED" and e["from_state"] is not None]
    assert len(requeued) == 1, moves
    assert requeued[0]["reason"] == "preempted" and high_id in requeued[0]["message"], requeued[0]
    assert "checkpointed and stopped" in requeued[0]["message"], requeued[0]["message"]
    assert not [m for m in moves if m[1] in ("FAILED", "RESTARTING")], moves
    # Asked once, in its history (a request, not a move: RUNNING -> RUNNING), before it was requeued.
    asked = [e for e in low_history if e["reason"] == "preempting"]
    assert len(asked) == 1 and asked[0]["from_state"] == asked[0]["to_state"] == "RUNNING", moves
    assert high_id in asked[0]["message"] and asked[0]["created_at"] <= requeued[0]["created_at"], asked
    # The high one started only once the low one had stopped (it never shared the 2 CPUs).
    high_started = next(e for e in history(member, high_id) if e["to_state"] == "STARTING")
    assert high_started["created_at"] >= requeued[0]["created_at"]

    # Its attempt budget is untouched: max_attempts 1, yet a second attempt ran and succeeded.
    assert (low_done["attempt"], low_done["preemptions"]) == (2, 1), low_done
    assert low_done["attempt"] - low_done["preemptions"] == 1

    # No step missing, none repeated but (at most) the one in flight: attempt 2 starts right after the
    # checkpoint attempt 1 stopped at.
    steps = metric_steps(member, low_id)
    assert set(steps) == {1, 2}, {a: (s[0], s[-1], len(s)) for a, s in steps.items()}
    first, second = steps[1], steps[2]
    assert first == list(range(1, first[-1] + 1)) and first[-1] >= PREEMPT_AFTER_STEP
    assert second == list(range(second[0], TOTAL_STEPS + 1))
    repeated = first[-1] - (second[0] - 1)
    assert 0 <= repeated <= 1, (first[-1], second[0])

    # The same final metrics as the uninterrupted run of the same spec (the high-priority job).
    final, reference = low_done["result"]["metrics"], high_done["result"]["metrics"]
    assert final["step"] == reference["step"] == TOTAL_STEPS
    assert abs(final["val_accuracy"] - reference["val_accuracy"]) <= ACCURACY_TOLERANCE, (final, reference)
    assert abs(final["val_loss"] - reference["val_loss"]) <= LOSS_TOLERANCE, (final, reference)
    assert metric_steps(member, high_id) == {1: list(range(1, TOTAL_STEPS + 1))}


# --- a sweep ------------------------------------------------------------------------------------------------

# Two 1-CPU trials fill the 2 CPUs: one of 1 epoch (it finishes before the preemption), one of SWEEP_EPOCHS
# (preempted while it trains). The preemptor needs both CPUs. A batch of 1 makes an epoch 1437 steps, about 2 s
# here: at a batch of 4 (0.7 s an epoch) the long trial of 6 epochs once ended before the preemption reached it.
SWEEP_EPOCHS = 8
SWEEP = {
    "base": {
        "workload": "digits",
        "epochs": 1,
        "seed": 5,
        "scaling": {"num_workers": 1, "cpus_per_worker": 1.0},
        "batch": {"per_worker": 1},
        "checkpoint": {"keep": 10},
        "retries": {"max_worker_restarts": 0, "max_attempts": 1},
    },
    "search_space": {"epochs": {"type": "grid", "values": [1, SWEEP_EPOCHS]}},
    "algorithm": "grid",
    "max_concurrent_trials": 2,
    "priority": 0,
}
PREEMPTOR = {"epochs": 1, "scaling": {"num_workers": 2, "cpus_per_worker": 1.0}, "priority": 10}


def sweep_get(api, path: str) -> list | dict:
    response = api.http.get(path)
    response.raise_for_status()
    return response.json()


def trials_by_epochs(api, sweep_id: str) -> dict[int, dict]:
    return {t["config"]["epochs"]: t for t in sweep_get(api, f"/v1/sweeps/{sweep_id}/trials")}


def test_a_high_priority_job_preempts_a_sweep_whose_paused_trial_resumes_and_finished_one_is_kept(member):
    sweep = member.http.post("/v1/sweeps", json=SWEEP)
    assert sweep.status_code == 201, sweep.text
    sweep_id = sweep.json()["id"]

    # The short trial has finished and the long one has passed an epoch: now the job arrives.
    deadline = time.monotonic() + 180
    while True:
        trials = trials_by_epochs(member, sweep_id)
        short, long = trials.get(1), trials.get(SWEEP_EPOCHS)
        if short and long and short["state"] == "SUCCEEDED" and long["state"] == "RUNNING" and long["iterations"] >= 1:
            break
        now = sweep_get(member, f"/v1/sweeps/{sweep_id}")
        if now["state"] in {"SUCCEEDED", "FAILED", "CANCELLED"} or time.monotonic() > deadline:
            pytest.fail(f"sweep {now['state']} ({now['reason']}: {now['message'][-2000:]}); trials {trials}")
        time.sleep(0.2)
    high = member.submit(**PREEMPTOR, name="preempt-sweep-high")
    assert high.status_code == 201, high.text
    high_id = high.json()["id"]

    deadline = time.monotonic() + 120
    while (now := sweep_get(member, f"/v1/sweeps/{sweep_id}"))["state"] != "QUEUED":
        if now["state"] in {"SUCCEEDED", "FAILED", "CANCELLED"} or time.monotonic() > deadline:
            pytest.fail(f"the sweep is {now['state']} ({now['reason']}: {now['message'][-2000:]}), never requeued")
        time.sleep(0.2)
    long_at_preemption = trials_by_epochs(member, sweep_id)[SWEEP_EPOCHS]
    assert long_at_preemption["state"] == "RUNNING", long_at_preemption  # paused, not finished
    assert long_at_preemption["iterations"] < SWEEP_EPOCHS

    member.wait(high_id, {"SUCCEEDED"}, timeout_s=180)
    deadline = time.monotonic() + 240
    while (done := sweep_get(member, f"/v1/sweeps/{sweep_id}"))["state"] != "SUCCEEDED":
        if done["state"] in {"FAILED", "CANCELLED"} or time.monotonic() > deadline:
            pytest.fail(f"the sweep is {done['state']} ({done['reason']}: {done['message'][-3000:]})")
        time.sleep(0.5)

    # Requeued once, preempted by the job, having checkpointed; its attempt budget (1) untouched.
    history = sweep_get(member, f"/v1/sweeps/{sweep_id}/events")
    requeued = [e for e in history if e["to_state"] == "QUEUED" and e["from_state"] is not None]
    assert len(requeued) == 1 and requeued[0]["reason"] == "preempted", history
    assert high_id in requeued[0]["message"] and "checkpointed and stopped" in requeued[0]["message"], requeued
    assert not [e for e in history if e["to_state"] in ("FAILED", "RESTARTING")], history
    assert (done["attempt"], done["preemptions"]) == (2, 1), done
    high_started = next(e for e in member.http.get(f"/v1/jobs/{high_id}/events").json() if e["to_state"] == "STARTING")
    assert high_started["created_at"] >= requeued[0]["created_at"]

    trials = trials_by_epochs(member, sweep_id)
    assert {t["state"] for t in trials.values()} == {"SUCCEEDED"}, trials
    # The finished trial was not run again: everything it reported came under the first attempt.
    short_events = sweep_get(member, f"/v1/trials/{trials[1]['id']}/events")
    assert {e["attempt"] for e in short_events} == {1}, short_events

    # The paused trial: every epoch once, in step order, and its Train run went on from its preemption checkpoint.
    points = sweep_get(member, f"/v1/trials/{trials[SWEEP_EPOCHS]['id']}/metrics")
    assert [p["epoch"] for p in points] == list(range(1, SWEEP_EPOCHS + 1)), points
    per_epoch = points[0]["step"]
    assert [p["step"] for p in points] == [per_epoch * e for e in range(1, SWEEP_EPOCHS + 1)], points
    run_dir = Path(points[-1]["checkpoint_path"]).parent
    marker = json.loads((run_dir.parent.parent / "preempted" / "attempt-1" / f"{run_dir.name}.json").read_text())
    snapshot = json.loads((run_dir / "checkpoint_manager_snapshot.json").read_text())
    steps = [result["metrics"]["step"] for result in snapshot["checkpoint_results"]]
    assert marker["step"] in steps, (marker, steps)
    assert steps == sorted(set(steps)), steps  # never back to an earlier checkpoint: resumed, not started over
    after = steps[steps.index(marker["step"]) + 1]
    assert after == (marker["step"] // per_epoch + 1) * per_epoch, (marker, steps)  # the end of that epoch
