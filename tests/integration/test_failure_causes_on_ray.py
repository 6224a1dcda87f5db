"""Retry budgets by cause, and the start timeout, on a real Ray cluster (example_workloads.faulty)."""

from __future__ import annotations

import time
from collections import Counter

import pytest
from ray.job_submission import JobStatus, JobSubmissionClient

from tests.ray_state import state_api

pytestmark = pytest.mark.integration

FAULTY = "example_workloads.faulty:build"


STUCK_START_TIMEOUT_S = 20.0


def _submit(member, name: str, config: dict, **spec) -> str:
    response = member.submit(name=name, workload=FAULTY, config={"points": 400, **config}, epochs=3, **spec)
    assert response.status_code == 201, response.text
    return response.json()["id"]


def _wait_terminal(member, job_id: str, timeout_s: float = 240) -> dict:
    deadline = time.monotonic() + timeout_s
    while (job := member.job(job_id))["state"] not in ("SUCCEEDED", "FAILED", "CANCELLED"):
        assert time.monotonic() < deadline, job
        time.sleep(0.5)
    return job


def _history(member, job_id: str) -> list[tuple[str, str, int]]:
    return [(e["to_state"], e["reason"], e["attempt"]) for e in member.http.get(f"/v1/jobs/{job_id}/events").json()]


def _ray_jobs(ray_cluster) -> JobSubmissionClient:
    return JobSubmissionClient(ray_cluster.dashboard_url, headers={"Authorization": f"Bearer {ray_cluster.token()}"})


def _submissions(ray_cluster, job_id: str) -> list[str]:
    return [j.submission_id for j in _ray_jobs(ray_cluster).list_jobs() if (j.metadata or {}).get("job_id") == job_id]


def test_an_exception_in_the_training_code_fails_at_once_with_its_traceback(member, ray_cluster):
    job_id = _submit(member, "code-error", {"fail_after_samples": 100}, retries={"max_worker_restarts": 3})
    job = _wait_terminal(member, job_id)
    # Raised in the workload's own package (example_workloads), so the job's code's error, not ours.
    assert (job["state"], job["reason"], job["attempt"]) == ("FAILED", "code_error", 1), job["message"][-2000:]
    assert "example_workloads/faulty.py" in job["message"].splitlines()[0]
    assert "ValueError: faulty workload: a bug in the training code" in job["message"]
    assert "Traceback" in job["message"] and "retry_app_errors is off" in job["message"]
    assert not [h for h in _history(member, job_id) if h[0] == "RESTARTING"]  # not one restart spent on a bug
    assert _submissions(ray_cluster, job_id) == [f"{job_id}-1"]


def test_out_of_memory_is_never_retried_even_when_errors_are(member, ray_cluster):
    job_id = _submit(
        member,
        "oom",
        {"fail_after_samples": 100, "error": "oom"},
        retries={"max_worker_restarts": 3, "retry_app_errors": True},
    )
    job = _wait_terminal(member, job_id)
    assert (job["state"], job["reason"], job["attempt"]) == ("FAILED", "oom", 1), job["message"][-2000:]
    assert "OutOfMemoryError" in job["message"]
    assert not [h for h in _history(member, job_id) if h[0] == "RESTARTING"]
    assert _submissions(ray_cluster, job_id) == [f"{job_id}-1"]


def test_a_transient_error_is_retried_when_the_spec_asks_for_it(member, ray_cluster, tmp_path):
    marker = tmp_path / "failed-once"
    job_id = _submit(
        member,
        "transient-error",
        {"fail_after_samples": 100, "fail_once_marker": str(marker)},
        retries={"max_worker_restarts": 1, "retry_app_errors": True},
    )
    job = _wait_terminal(member, job_id)
    assert job["state"] == "SUCCEEDED", job["message"][-2000:]
    assert marker.exists()
    restarts = [h for h in _history(member, job_id) if h[0] == "RESTARTING"]
    assert restarts == [("RESTARTING", "code_error", 1)] and job["attempt"] == 1
    # How the worker group was started again (workers.train.group_start): two groups of two workers, no idle
    # Ray Data actor with either, and each group's placement group placed on the GCS's first try (without
    # the wait for the first group's resources, the second one's first try fails and waits for a retry).
    ray_job = _ray_jobs(ray_cluster).get_job_info(f"{job_id}-1").job_id
    cluster = (ray_cluster.dashboard_url, ray_cluster.token())
    actors = Counter(a["class_name"] for a in state_api(*cluster, "actors", job_id=ray_job))
    assert actors["RayTrainWorker"] == 4 and actors["DatasetManager"] == 0, actors
    groups = state_api(*cluster, "placement_groups", creator_job_id=ray_job)
    assert [g["stats"]["scheduling_attempt"] for g in groups] == [1, 1], [g["stats"] for g in groups]


def test_a_job_stuck_starting_fails_with_start_timeout_and_its_ray_job_is_stopped(
    member, ray_cluster, service_settings, monkeypatch
):
    # Only this stuck job runs meanwhile, so the session's start timeout (sized for real starts on a busy
    # machine) is shortened for it: the reconciler reads the setting at every pass.
    monkeypatch.setattr(service_settings, "start_timeout_s", STUCK_START_TIMEOUT_S)
    job_id = _submit(member, "stuck", {"stall_s": 3600}, retries={"max_attempts": 1})
    started = time.monotonic()
    job = _wait_terminal(member, job_id, timeout_s=STUCK_START_TIMEOUT_S + 120)
    assert (job["state"], job["reason"]) == ("FAILED", "start_timeout"), job
    assert time.monotonic() - started >= STUCK_START_TIMEOUT_S - 5
    assert f"STARTING for longer than ORCHESTRATOR_START_TIMEOUT_S ({STUCK_START_TIMEOUT_S:g} s)" in job["message"]
    deadline = time.monotonic() + 60
    while (status := _ray_jobs(ray_cluster).get_job_status(f"{job_id}-1")) != JobStatus.STOPPED:
        assert time.monotonic() < deadline, status
        time.sleep(1)
