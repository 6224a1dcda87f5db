"""One ``Idempotency-Key`` for every create: ``POST /v1/jobs``, ``/v1/sweeps`` and ``/v1/deployments`` (SQLite and
PostgreSQL). The same key with the same body answers the first request's object (200, ``Idempotent-Replayed``);
with another body, 409; and 20 requests with one key at the same moment over real HTTP make one object, never a
500 and never a "name taken" for the retries of a deployment's own create (docs/rest-api.md, "Retries").
The 100-request race of jobs, through one and through two replicas, is ``test_idempotent_submits.py``."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from sqlalchemy import func, select

from orchestrator.db.models import Deployment, Job, Sweep
from tests.unit.api_helpers import ADMIN, assert_one_made_and_the_rest_replayed, auth
from tests.unit.live_server import serve
from tests.unit.test_deployments import finished_job

SWEEP = {
    "base": {"workload": "digits", "epochs": 2, "scaling": {"num_workers": 1, "cpus_per_worker": 0.5}},
    "search_space": {"lr.base": {"type": "loguniform", "low": 1e-3, "high": 0.3}},
}


def _bodies(app, tmp_path) -> dict[str, tuple[type, dict, dict]]:
    """Per route: the model, a body, and another body (which a reused key must refuse)."""
    job_id, _ = finished_job(app, tmp_path)
    deployment = {"name": "nightly", "source": {"job_id": job_id}}
    return {
        "/v1/jobs": (Job, {"workload": "digits", "name": "nightly"}, {"workload": "digits", "name": "weekly"}),
        "/v1/sweeps": (Sweep, {**SWEEP, "name": "nightly"}, {**SWEEP, "name": "nightly", "num_samples": 3}),
        "/v1/deployments": (Deployment, deployment, {**deployment, "replicas": 2}),
    }


def _count(app, model: type, key: str) -> int:
    """Rows of ``model`` made with Idempotency-Key ``key`` (the deployments' source job is a row too)."""
    with app.state.service.sessions() as session:
        return session.scalar(select(func.count()).select_from(model).where(model.idempotency_key == key))


@pytest.mark.parametrize("route", ["/v1/jobs", "/v1/sweeps", "/v1/deployments"])
def test_a_key_replays_its_create_and_refuses_another_body(app, client, tmp_path, route):
    model, body, other = _bodies(app, tmp_path)[route]
    key = "nightly-2026-11-28"
    headers = {**auth(ADMIN), "Idempotency-Key": key}
    first = client.post(route, json=body, headers=headers)
    assert first.status_code == 201, first.text
    assert "Idempotent-Replayed" not in first.headers
    again = client.post(route, json=body, headers=headers)
    assert again.status_code == 200 and again.headers["Idempotent-Replayed"] == "true", again.text
    assert again.json()["id"] == first.json()["id"] and _count(app, model, key) == 1

    refused = client.post(route, json=other, headers=headers)
    assert refused.status_code == 409, refused.text
    detail = refused.json()["detail"]
    assert key in detail and first.json()["id"] in detail and "new key" in detail, detail
    assert _count(app, model, key) == 1  # nothing half-made

    # Without a key, a repeat is a new object (a deployment's name is taken: 409 saying so).
    unkeyed = client.post(route, json=body, headers=auth(ADMIN))
    if model is Deployment:
        assert unkeyed.status_code == 409 and "already exists" in unkeyed.json()["detail"], unkeyed.text
    else:
        assert unkeyed.status_code == 201 and unkeyed.json()["id"] != first.json()["id"]


def test_a_key_belongs_to_its_project(app, client, tmp_path):
    """Another project may use the same key for its own sweep: keys are unique per project, not cluster-wide."""
    from tests.unit.api_helpers import make_project

    _, keys_a = make_project(client, "team-a")
    _, keys_b = make_project(client, "team-b")
    made = [
        client.post("/v1/sweeps", json=SWEEP, headers={**auth(keys[role]), "Idempotency-Key": "k"})
        for keys, role in ((keys_a, "member"), (keys_b, "member"))
    ]
    assert [m.status_code for m in made] == [201, 201], [m.text for m in made]
    assert made[0].json()["id"] != made[1].json()["id"]


CONCURRENT_POSTS = 20


@pytest.mark.parametrize("route", ["/v1/sweeps", "/v1/deployments"])
def test_concurrent_creates_with_one_key_make_one_object(database_url, tmp_path, backend, route):
    with serve(tmp_path, backend, database_url=database_url, serve_port=8123) as live:
        model, body, _ = _bodies(live.app, tmp_path)[route]
        headers = {**auth(ADMIN), "Idempotency-Key": "race"}
        answers = _at_once(lambda client: client.post(route, json=body, headers=headers), live.url)

        assert_one_made_and_the_rest_replayed(answers)
        assert _count(live.app, model, "race") == 1


def _at_once(post: Callable[[httpx.Client], httpx.Response], url: str) -> list[httpx.Response]:
    start = threading.Barrier(CONCURRENT_POSTS)

    def one(_: int) -> httpx.Response:
        with httpx.Client(base_url=url, timeout=60) as client:  # a connection each: handled at once
            start.wait()
            return post(client)

    with ThreadPoolExecutor(CONCURRENT_POSTS) as pool:
        return list(pool.map(one, range(CONCURRENT_POSTS)))
