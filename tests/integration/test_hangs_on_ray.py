"""Hang detection on the real cluster (docs/jobs.md "Hangs"): a 2-worker training function whose rank 0 sleeps
after a few steps while rank 1 waits for it in an all-reduce. The control plane sees no progress for
``failure.hang_timeout_s``, asks both ranks for their stacks (printed in the attempt's log, summed up in the
attempt's end: rank 1 in a collective, rank 0 at its ``time.sleep``), ends the attempt ``hung`` and resumes from
the latest checkpoint: a hang that happens once, the job then succeeds; a hang that repeats, it fails ``hung``
when its attempts run out. Both jobs run side by side (half a CPU per worker). And a straggler: a built-in
workload whose rank 1 loads its data slowly is named in the job's stragglers, and with ``on_straggler: restart``
its attempt checkpoints, stops and is restarted once."""

from __future__ import annotations

import re
import time

import pytest

from tests.hanging_function import ENTRYPOINT, code_zip
from tests.integration.conftest import TERMINAL
from tests.integration.test_train_function_on_ray import upload

pytestmark = pytest.mark.integration

STEPS, HANG_AT = 8, 5


def _spec(code_id: str, name: str, marker: str, always: bool) -> dict:
    return {
        "name": name,
        "entrypoint": ENTRYPOINT,
        "code": {"id": code_id},
        "config": {"steps": STEPS, "hang_at": HANG_AT, "marker": marker, "always": always},
        "scaling": {"num_workers": 2, "cpus_per_worker": 0.5},
        "retries": {"max_attempts": 2},
        "failure": {"hang_timeout_s": 8},
    }


def _logs(member, job_id: str, attempt: int) -> str:
    response = member.http.get(f"/v1/jobs/{job_id}/logs", params={"attempt": attempt})
    assert response.status_code == 200, response.text
    return response.text


def _wait(member, job_ids: list[str], timeout_s: float) -> dict[str, dict]:
    deadline = time.monotonic() + timeout_s
    while True:
        jobs = {job_id: member.job(job_id) for job_id in job_ids}
        if all(job["state"] in TERMINAL for job in jobs.values()):
            return jobs
        if time.monotonic() > deadline:
            pytest.fail(f"not ended in {timeout_s} s: {[(j['state'], j['message'][-500:]) for j in jobs.values()]}")
        time.sleep(1)


def test_a_hung_function_is_found_its_stacks_taken_and_it_resumes_or_fails_hung(
    member, admin, service_settings, tmp_path, monkeypatch
):
    monkeypatch.setattr(service_settings, "hang_stacks_poll_s", 1.0)  # rank 1 answers within a second
    code_id = upload(member, code_zip())
    once = member.http.post("/v1/jobs", json=_spec(code_id, "hangs-once", str(tmp_path / "once"), False))
    always = member.http.post("/v1/jobs", json=_spec(code_id, "hangs-always", str(tmp_path / "always"), True))
    assert once.status_code == always.status_code == 201, (once.text, always.text)
    once_id, always_id = once.json()["id"], always.json()["id"]

    jobs = _wait(member, [once_id, always_id], timeout_s=420)

    # Once: attempt 1 hung at step 5, its end says where each rank was, attempt 2 resumed from step 4.
    done = jobs[once_id]
    assert (done["state"], done["attempt"]) == ("SUCCEEDED", 2), done
    events = member.http.get(f"/v1/jobs/{once_id}/events").json()
    reasons = [e["reason"] for e in events]
    assert "hang_suspected" in reasons, reasons
    (hung,) = [e for e in events if e["reason"] == "hung"]
    assert hung["to_state"] == "RESTARTING" and hung["attempt"] == 1, hung
    message = hung["message"]
    assert "in a collective (waiting for the others): rank 1" in message, message
    assert "elsewhere: rank 0" in message and "time.sleep(3600)" in message, message
    assert "starting attempt 2 of 2 from the latest checkpoint" in message, message
    # Attempt 2's start has a timeline of its own (a training function's: no data_ready stage), after attempt 1's.
    first, second = done["startup"]
    assert (first["attempt"], second["attempt"]) == (1, 2), done["startup"]
    stages = [s["stage"] for s in second["stages"]]
    assert stages[0] == "admitted" and stages[-1] == "first_step" and "data_ready" not in stages, stages
    assert second["stages"][0]["at"] > first["stages"][-1]["at"] and second["first_step_s"] > 0, done["startup"]
    points = [(m["attempt"], m["step"]) for m in member.http.get(f"/v1/jobs/{once_id}/metrics").json()]
    assert points == [(1, s) for s in range(1, HANG_AT)] + [(2, s) for s in range(HANG_AT, STEPS + 1)], points
    log = _logs(member, once_id, 1)
    for rank in (0, 1):
        assert f"[rank {rank} stacks] the control plane found no progress" in log, log[-3000:]
    assert "[rank 0 stacks]     time.sleep(3600)" in log, log[-3000:]

    # Always: both attempts hung; the second used up the attempts, and the job failed hung.
    failed = jobs[always_id]
    assert (failed["state"], failed["reason"], failed["attempt"]) == ("FAILED", "hung", 2), failed
    assert "elsewhere: rank 0" in failed["message"] and "attempt 2 of 2: none left" in failed["message"], failed

    # Rank 0 hung three times (elsewhere each time): its node, Ray's only one here, is bad, shown with those
    # hangs (rank 0 reported where every rank runs), and never avoided while it is the only node. Cleared after.
    (bad,) = member.http.get("/v1/cluster").json()["bad_nodes"]
    assert re.fullmatch(r"[0-9a-f]{56}", bad["node_id"]), bad
    hangs = sorted((f["job_id"], f["attempt"]) for f in bad["faults"] if f["kind"] == "hung")
    assert hangs == sorted([(once_id, 1), (always_id, 1), (always_id, 2)]), bad
    assert admin.http.delete(f"/v1/cluster/bad-nodes/{bad['node_id']}").status_code == 204


def test_a_rank_that_loads_its_data_slowly_is_flagged_a_straggler_and_restarted(member):
    """``on_straggler: restart`` with 2 attempts: attempt 1's slow rank 1 is flagged, the attempt checkpoints and
    stops, attempt 2 resumes from that checkpoint (on the same node: Ray's only one here, so nothing to avoid),
    its rank 1 is flagged again, and with no attempt left it only warns and finishes."""
    spec = {
        "name": "straggler",
        "workload": "example_workloads.faulty:build",
        "config": {"slow_rank": 1, "slow_s": 0.004, "points": 800},  # 32 samples: about 0.13 s a step more
        "scaling": {"num_workers": 2, "cpus_per_worker": 0.5},
        "batch": {"per_worker": 32},
        "epochs": 2,
        "metrics_every_steps": 2,
        "failure": {"on_straggler": "restart"},
        "retries": {"max_attempts": 2},
    }
    response = member.http.post("/v1/jobs", json=spec)
    assert response.status_code == 201, response.text
    job_id = response.json()["id"]
    done = member.wait(job_id, {"SUCCEEDED"}, timeout_s=420)

    assert done["attempt"] == 2, done
    (straggler,) = done["stragglers"]  # attempt 2's own
    assert straggler["rank"] == 1 and straggler["ratio"] > 1.5, straggler
    events = member.http.get(f"/v1/jobs/{job_id}/events").json()
    rows = [(e["reason"], e["attempt"]) for e in events if e["reason"].startswith("straggler")]
    assert rows == [("straggler", 1), ("straggler_restart", 1), ("straggler_restarted", 1), ("straggler", 2)], rows
    flagged = next(e for e in events if e["reason"] == "straggler")
    assert flagged["to_state"] == "RUNNING" and "rank 1 is a straggler" in flagged["message"], flagged
    windows = [m for m in member.http.get(f"/v1/jobs/{job_id}/metrics").json() if "lr" in m["values"]]
    first = [m["step"] for m in windows if m["attempt"] == 1]
    second = [m["step"] for m in windows if m["attempt"] == 2]
    assert len(first) >= 3 and second, windows
    assert second[0] > 2 and second[0] <= first[-1] + 2, (first, second)  # resumed from the stop's checkpoint


def test_a_hung_sweep_trial_has_its_workers_restarted_or_fails_hung(member, service_settings, tmp_path, monkeypatch):
    """The same function as a sweep's two trials side by side: one hangs once, one at every try. A trial shares its
    sweep's Ray job, so its hang ends inside it: its ranks answer the sweep's request for their stacks, the control
    plane names its workers in ``end_workers``, they end their processes and Ray Train restarts them from the
    trial's latest checkpoint (``retries.max_worker_restarts`` 1). Once: the trial resumes and succeeds. Always: the
    restart hangs again, the restarts run out and the trial fails ``hung``."""
    monkeypatch.setattr(service_settings, "hang_stacks_poll_s", 1.0)
    code_id = upload(member, code_zip())
    base = _spec(code_id, "hung-trials", str(tmp_path / "marker-"), False)
    base["config"] = {**base["config"], "steps_per_epoch": 4}  # step 8 is epoch 2, the last
    base.update(epochs=2, retries={"max_worker_restarts": 1})
    del base["name"], base["config"]["always"]
    sweep = member.http.post(
        "/v1/sweeps",
        json={
            "name": "hung-trials",
            "base": base,
            "search_space": {"config.mode": {"type": "grid", "values": ["once", "always"]}},
            "algorithm": "grid",
            "metric": "total",
            "mode": "max",
            "max_concurrent_trials": 2,
        },
    )
    assert sweep.status_code == 201, sweep.text
    sweep_id = sweep.json()["id"]
    deadline = time.monotonic() + 420
    while (state := member.http.get(f"/v1/sweeps/{sweep_id}").json())["state"] not in TERMINAL:
        assert time.monotonic() < deadline, state
        time.sleep(1)
    assert state["state"] == "SUCCEEDED", state  # one trial succeeded
    trials = {t["config"]["config.mode"]: t for t in member.http.get(f"/v1/sweeps/{sweep_id}/trials").json()}

    once = trials["once"]
    assert (once["state"], once["iterations"]) == ("SUCCEEDED", 2), once
    assert [s["stage"] for s in once["startup"]] == ["trial_started", "first_result"], once["startup"]
    events = member.http.get(f"/v1/trials/{once['id']}/events").json()
    events = events["items"] if isinstance(events, dict) else events
    reasons = [e["reason"] for e in events]
    assert reasons.count("hang_suspected") >= 1 and reasons.count("hung") == 1, reasons
    (hung,) = [e for e in events if e["reason"] == "hung"]
    assert hung["to_state"] == "RUNNING", hung
    assert "in a collective (waiting for the others): rank 1" in hung["message"], hung["message"]
    assert "elsewhere: rank 0" in hung["message"] and "time.sleep(3600)" in hung["message"], hung["message"]
    assert "Ray Train restarts them" in hung["message"], hung["message"]

    always = trials["always"]
    assert (always["state"], always["reason"]) == ("FAILED", "hung"), always
    assert "elsewhere: rank 0" in always["message"] and "hung 2 time(s)" in always["message"], always["message"]
    log = member.http.get(f"/v1/sweeps/{sweep_id}/logs").text
    assert "[rank 0 stacks] the control plane found no progress" in log, log[-3000:]
    assert "the control plane found trial" in log and "hung" in log, log[-3000:]
