"""Quotas (docs/scheduling.md, "Quotas") on the real local Ray cluster: two projects with a quota of 1 CPU each share
the session's 2-CPU cluster. Each submits two 1-CPU jobs at once: each project has one job running at a time, both
projects run side by side, and a project's second job waits with ``quota_exceeded`` until its first ends."""

from __future__ import annotations

import time
from datetime import datetime

import pytest

from tests.integration.conftest import Api
from tests.integration.test_sweeps_on_ray import wait_cluster_idle

pytestmark = pytest.mark.integration

ONE_CPU = {"num_workers": 1, "cpus_per_worker": 1.0}


def _member_of(admin: Api, name: str) -> tuple[str, Api]:
    project = admin.http.post("/v1/projects", json={"name": name})
    assert project.status_code == 201, project.text
    project_id = project.json()["id"]
    quota = admin.http.put(f"/v1/projects/{project_id}/quota", json={"max_cpus": 1, "borrowing": False})
    assert quota.status_code == 200 and quota.json()["quota"]["max_cpus"] == 1, quota.text
    key = admin.http.post(f"/v1/projects/{project_id}/keys", json={"role": "member"}).json()["key"]
    return project_id, Api(str(admin.http.base_url), key)


def _seen_waiting_on_quota(api: Api, job_id: str, timeout_s: float = 60) -> dict:
    """The job as first seen QUEUED with reason quota_exceeded; a failure if it was admitted before that."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = api.job(job_id)
        assert job["state"] == "QUEUED", f"admitted before it was seen waiting on its quota: {job}"
        if job["reason"] == "quota_exceeded":
            return job
        time.sleep(0.1)
    pytest.fail(f"job {job_id} never waited on its quota: {api.job(job_id)}")


def _held(api: Api, job_id: str) -> tuple[float, float]:
    """When the job was admitted (QUEUED -> STARTING) and when it ended, as the control plane recorded them."""
    events = api.http.get(f"/v1/jobs/{job_id}/events").json()
    started = next(e for e in events if e["to_state"] == "STARTING")
    ended = events[-1]
    assert ended["to_state"] == "SUCCEEDED", events
    return datetime.fromisoformat(started["created_at"]).timestamp(), datetime.fromisoformat(
        ended["created_at"]
    ).timestamp()


def test_two_projects_with_one_cpu_quotas_share_two_cpus_one_job_each(admin, ray_cluster):
    wait_cluster_idle(ray_cluster)  # earlier tests' actors gone: the 2 CPUs are the two projects' to share
    projects = {name: _member_of(admin, name) for name in ("quota-vision", "quota-speech")}
    jobs: dict[str, list[str]] = {}
    for name, (_, member) in projects.items():
        for i in range(2):
            response = member.submit(name=f"{name}-{i}", epochs=1, scaling=ONE_CPU)
            assert response.status_code == 201, response.text
            jobs.setdefault(name, []).append(response.json()["id"])

    # While each project's first job holds its CPU, its second waits on its quota (not on the cluster), and
    # says so. Watched from the submit on: a one-epoch first job may end before a later look.
    for name, (_, member) in projects.items():
        waiting = _seen_waiting_on_quota(member, jobs[name][1])
        assert waiting["message"] == f"project {name} uses 1 of 1 CPUs; this job needs 1 (borrowing is off)"

    spans = {}
    for name, (_, member) in projects.items():
        for job_id in jobs[name]:
            member.wait(job_id, {"SUCCEEDED"}, timeout_s=180)
        spans[name] = [_held(member, job_id) for job_id in jobs[name]]

    for name, (first, second) in spans.items():
        # One at a time in a project: its second job was admitted only after its first had ended.
        assert second[0] >= first[1], (name, spans)
    # Each project got its share at once: the two first jobs held their CPU at the same time.
    vision, speech = spans["quota-vision"][0], spans["quota-speech"][0]
    assert max(vision[0], speech[0]) < min(vision[1], speech[1]), spans
