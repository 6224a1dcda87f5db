"""Hole 7: a member could submit at any priority up to 1000 and deploy up to 16 GPUs x 100 replicas. Now a
cluster-wide admin sets a project's ``max_priority`` (on creation or ``PATCH /v1/projects/{id}``, shown on
``GET /v1/projects/{id}``), a job or sweep above it is a 422 naming the cap, and a deployment whose replicas
together ask more than the whole cluster holds is a 422 saying what fits."""

from __future__ import annotations

import pytest

from tests.security.helpers import make_key
from tests.unit.api_helpers import ADMIN, auth, make_project, submit
from tests.unit.test_deployments import deploy, finished_job
from tests.unit.test_sweeps import post_sweep


@pytest.fixture
def settings_overrides() -> dict:
    return {"serve_port": 8123, "workload_packages": ""}


def test_a_cluster_admin_caps_a_projects_priority_and_members_cannot_pass_it(client):
    created = client.post("/v1/projects", json={"name": "capped", "max_priority": 10}, headers=auth(ADMIN))
    assert created.status_code == 201, created.text
    project_id = created.json()["id"]
    assert created.json()["max_priority"] == 10
    member = make_key(client, project_id, "member")["key"]
    project_admin = make_key(client, project_id, "admin")["key"]

    assert client.get(f"/v1/projects/{project_id}", headers=auth(member)).json()["max_priority"] == 10
    assert submit(client, member, priority=10).status_code == 201
    over = submit(client, member, priority=11)
    assert over.status_code == 422 and "max_priority" in over.text and "10" in over.text
    assert submit(client, project_admin, priority=500).status_code == 422  # a project's admin is capped too
    sweep = post_sweep(client, member, priority=11)
    assert sweep.status_code == 422 and "max_priority" in sweep.text

    # Only a cluster-wide admin changes the cap.
    assert (
        client.patch(f"/v1/projects/{project_id}", json={"max_priority": 1000}, headers=auth(project_admin)).status_code
        == 403
    )
    assert (
        client.patch(f"/v1/projects/{project_id}", json={"max_priority": 1000}, headers=auth(member)).status_code == 403
    )
    patched = client.patch(f"/v1/projects/{project_id}", json={"max_priority": 0}, headers=auth(ADMIN))
    assert patched.status_code == 200 and patched.json()["max_priority"] == 0
    assert submit(client, member, priority=1).status_code == 422
    assert submit(client, member, priority=-5).status_code == 201
    # Another project's cap is not visible.
    _, other = make_project(client, "other")
    assert client.get(f"/v1/projects/{project_id}", headers=auth(other["member"])).status_code == 404


def test_a_deployment_cannot_ask_more_than_the_whole_cluster_holds(app, client, backend, tmp_path):
    backend.total = {"CPU": 4.0, "GPU": 2.0}
    project_id, keys = make_project(client, "serving")
    job, _ = finished_job(app, tmp_path, project_id=project_id)
    too_many = deploy(client, keys["member"], name="big", source={"job_id": job}, replicas=3, resources={"gpus": 1})
    assert too_many.status_code == 422, too_many.text
    assert "2 GPU" in too_many.text and "at most 2 replicas" in too_many.text
    scaling = deploy(
        client,
        keys["member"],
        name="big",
        source={"job_id": job},
        replicas={"min": 1, "max": 100},
        resources={"gpus": 0.5},
    )
    assert scaling.status_code == 422 and "replicas" in scaling.text
    fits = deploy(client, keys["member"], name="fits", source={"job_id": job}, replicas=2, resources={"gpus": 1})
    assert fits.status_code == 201, fits.text
    grown = client.patch("/v1/deployments/fits", json={"replicas": 5}, headers=auth(keys["member"]))
    assert grown.status_code == 422 and "at most 2 replicas" in grown.text
