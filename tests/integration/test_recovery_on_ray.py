"""Kill -9 a training worker or a job's driver mid-run: the job resumes from its latest checkpoint."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from ray.job_submission import JobSubmissionClient

pytestmark = pytest.mark.integration

EPOCHS = 30


def _wait_for_checkpoint(member, job_id: str, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while not member.http.get(f"/v1/jobs/{job_id}/checkpoints").json():
        assert time.monotonic() < deadline, "no checkpoint was recorded"
        assert member.job(job_id)["state"] in ("STARTING", "RUNNING"), member.job(job_id)
        time.sleep(0.5)


def _train_worker_pids() -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and b"ray::RayTrainWorker" in (proc / "cmdline").read_bytes():
                pids.append(int(proc.name))
        except OSError:
            pass
    return pids


def _epoch_points(member, job_id: str) -> list[tuple[int, int]]:
    metrics = member.http.get(f"/v1/jobs/{job_id}/metrics").json()
    return [(m["attempt"], m["epoch"]) for m in metrics if "val_accuracy" in m["values"]]


def _history(member, job_id: str) -> list[tuple[str, str, int]]:
    return [(e["to_state"], e["reason"], e["attempt"]) for e in member.http.get(f"/v1/jobs/{job_id}/events").json()]


def test_a_killed_worker_is_replaced_and_the_run_resumes(member):
    job_id = member.submit(name="kill-a-worker", epochs=EPOCHS).json()["id"]
    member.wait(job_id, {"RUNNING"}, timeout_s=180)
    _wait_for_checkpoint(member, job_id)
    [victim, *_] = _train_worker_pids()
    os.kill(victim, signal.SIGKILL)

    job = member.wait(job_id, {"SUCCEEDED"}, timeout_s=300)
    assert job["attempt"] == 1  # Ray Train replaced the worker group inside the same attempt
    assert ("RESTARTING", "worker_died", 1) in _history(member, job_id)
    assert _history(member, job_id)[-2:] == [("RUNNING", "training_started", 1), ("SUCCEEDED", "completed", 1)]
    # Every epoch reported, none twice: an epoch redone after the restart lands on the same point.
    assert [epoch for _, epoch in _epoch_points(member, job_id)] == list(range(1, EPOCHS + 1))
    assert job["result"]["metrics"]["val_accuracy"] >= 0.95


def test_a_killed_driver_gets_a_new_attempt_that_resumes_from_the_checkpoint(member, ray_cluster):
    job_id = member.submit(name="kill-the-driver", epochs=EPOCHS).json()["id"]
    member.wait(job_id, {"RUNNING"}, timeout_s=180)
    _wait_for_checkpoint(member, job_id)
    ray_jobs = JobSubmissionClient(ray_cluster.dashboard_url, headers={"Authorization": f"Bearer {ray_cluster.token()}"})
    os.kill(int(ray_jobs.get_job_info(f"{job_id}-1").driver_info.pid), signal.SIGKILL)

    job = member.wait(job_id, {"SUCCEEDED"}, timeout_s=300)
    assert job["attempt"] == 2
    history = _history(member, job_id)
    assert ("RESTARTING", "driver_failed", 1) in history and ("RUNNING", "training_started", 2) in history
    points = _epoch_points(member, job_id)
    first = [epoch for attempt, epoch in points if attempt == 1]
    second = [epoch for attempt, epoch in points if attempt == 2]
    assert second and second[0] > 1, points  # resumed from a checkpoint, not from scratch
    assert second[0] <= first[-1] + 1  # and lost at most the work since it
    assert sorted(set(first) | set(second)) == list(range(1, EPOCHS + 1))
    assert [j.submission_id for j in ray_jobs.list_jobs() if (j.metadata or {}).get("job_id") == job_id].count(f"{job_id}-2") == 1
