"""Hole 6, paging: every list endpoint takes ``limit`` (at most a maximum page size) and ``cursor`` (the
jobs' cursor scheme); the body stays a JSON list, the next page's cursor is in the ``X-Next-Cursor``
header, absent on the last page."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from orchestrator.db.models import Deployment, DeploymentEvent, DeploymentState
from tests.security.test_run_tokens_and_checkpoint_paths import post, started_job
from tests.unit.api_helpers import ADMIN, auth, submit, tick
from tests.unit.code_archives import zip_of
from tests.unit.test_deployments import deploy, finished_job
from tests.unit.test_sweeps import driver_token, post_sweep

MAX_PAGE, MAX_METRICS_PAGE = 200, 1000  # api/paging.py; said in docs/security.md


@pytest.fixture
def settings_overrides() -> dict:
    return {"serve_port": 8123, "workload_packages": ""}


def walk(client, path: str, limit: int) -> tuple[list, int]:
    """Every item of a list endpoint, page by page; and how many pages it took."""
    items, cursor, pages = [], None, 0
    while True:
        params = {"limit": limit} | ({"cursor": cursor} if cursor else {})
        response = client.get(path, params=params, headers=auth(ADMIN))
        assert response.status_code == 200, response.text
        page = response.json()
        assert isinstance(page, list) and len(page) <= limit
        items += page
        pages += 1
        cursor = response.headers.get("X-Next-Cursor")
        if cursor is None:
            return items, pages


def test_every_list_endpoint_pages_with_a_cursor_header(app, client, backend, tmp_path):
    backend.total = {"CPU": 64.0, "GPU": 0.0}  # room for the job and the sweep at once
    job, token = started_job(app, client, backend)
    assert post(client, job, token, {"type": "state", "state": "running"}).status_code == 200
    points = [{"type": "metrics", "epoch": 1, "step": s, "values": {"loss": 1.0 / s}} for s in range(1, 8)]
    assert post(client, job, token, *points).status_code == 200
    for _ in range(4):
        submit(client, ADMIN)
    sweeps = [post_sweep(client).json()["id"] for _ in range(3)]
    tick(app)
    headers = driver_token(client, backend, f"{sweeps[0]}-1")
    events = [
        {
            "type": "trial",
            "trial": f"t_{i:05d}",
            "state": "running",
            "config": {"lr.base": 0.1},
            "epoch": e,
            "step": e,
            "metrics": {"val_accuracy": 0.1 * e},
        }
        for i in range(5)
        for e in (1, 2, 3)
    ]
    sent = client.post(
        f"/internal/v1/sweeps/{sweeps[0]}/events", json={"attempt": 1, "events": events}, headers=headers
    )
    assert sent.status_code == 200, sent.text
    done, _ = finished_job(app, tmp_path, accuracies=(0.1, 0.2, 0.3, 0.4, 0.5))
    for name in ("d-a", "d-b", "d-c"):
        assert deploy(client, name=name, source={"job_id": done}).status_code == 201
    with app.state.service.sessions.begin() as session:  # a deployment with a history worth paging
        deployment_id = session.scalars(select(Deployment.id).where(Deployment.name == "d-a")).one()
        for i in range(5):
            session.add(
                DeploymentEvent(
                    deployment_id=deployment_id,
                    version=1,
                    from_state=None,
                    to_state=DeploymentState.DEPLOYING,
                    reason=f"r{i}",
                )
            )
    trials = client.get(f"/v1/sweeps/{sweeps[0]}/trials", headers=auth(ADMIN)).json()
    for i in range(3):  # code packages (the admin's: the default project's)
        files = {"file": ("code.zip", zip_of({f"m{i}.py": b"x"}))}
        assert client.post("/v1/code", files=files, headers=auth(ADMIN)).status_code == 201

    for path, limit in [
        (f"/v1/jobs/{job}/events", 1),
        (f"/v1/jobs/{job}/metrics", 2),
        (f"/v1/jobs/{done}/checkpoints", 2),
        ("/v1/sweeps", 2),
        (f"/v1/sweeps/{sweeps[0]}/trials", 2),
        (f"/v1/sweeps/{sweeps[0]}/events", 1),
        (f"/v1/trials/{trials[0]['id']}/metrics", 1),
        ("/v1/deployments", 2),
        ("/v1/deployments/d-a/events", 2),
        ("/v1/code", 2),
    ]:
        whole = client.get(path, headers=auth(ADMIN))  # no limit: the whole (small) list, as before
        assert whole.status_code == 200 and "X-Next-Cursor" not in whole.headers
        assert isinstance(whole.json(), list) and len(whole.json()) > limit, path
        paged, pages = walk(client, path, limit)
        assert paged == whole.json(), path  # same items, same order, none twice
        assert pages > 1, path

    assert (
        client.get(f"/v1/jobs/{job}/metrics", params={"limit": MAX_METRICS_PAGE + 1}, headers=auth(ADMIN)).status_code
        == 422
    )
    assert client.get("/v1/sweeps", params={"limit": MAX_PAGE + 1}, headers=auth(ADMIN)).status_code == 422
    bad = client.get(f"/v1/jobs/{job}/events", params={"cursor": "not-a-cursor"}, headers=auth(ADMIN))
    assert bad.status_code == 422 and "cursor" in bad.text


def test_projects_and_keys_page_the_same_way(client):
    for name in ("p-a", "p-b", "p-c"):
        assert client.post("/v1/projects", json={"name": name}, headers=auth(ADMIN)).status_code == 201
    project = client.get("/v1/projects", headers=auth(ADMIN)).json()[0]["id"]
    for role in ("admin", "member", "viewer"):
        made = client.post(f"/v1/projects/{project}/keys", json={"role": role}, headers=auth(ADMIN))
        assert made.status_code == 201, made.text
    for path in ("/v1/projects", f"/v1/projects/{project}/keys"):
        whole = client.get(path, headers=auth(ADMIN))  # no limit: the whole (small) list, as before
        assert whole.status_code == 200 and "X-Next-Cursor" not in whole.headers
        assert len(whole.json()) >= 3, path
        paged, pages = walk(client, path, 1)
        assert paged == whole.json(), path
        assert pages == len(whole.json()), path
    assert client.get("/v1/projects", params={"limit": MAX_PAGE + 1}, headers=auth(ADMIN)).status_code == 422
    bad = client.get("/v1/projects", params={"cursor": "not-a-cursor"}, headers=auth(ADMIN))
    assert bad.status_code == 422 and "cursor" in bad.text
