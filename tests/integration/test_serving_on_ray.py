"""Deployments on a real Ray Serve (the session's local cluster), driven over the service's REST API.

One digits job trains; its checkpoints are then deployed, updated, rolled back, updated to a broken
checkpoint, grown past the project's CPU quota (it waits QUEUED, the old version serving) and deleted,
while a bounded client (a few threads, one request in flight each) calls the deployment throughout: not one
request may fail, and the answers must switch to each new version.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
from sklearn.datasets import load_digits

from tests.integration.conftest import Api, key_headers, remove_serving
from workers.train.checkpoints import load_model_from_checkpoint

pytestmark = pytest.mark.integration

NAME = "digits-it"
ROWS = load_digits(return_X_y=True)[0][:40].tolist()  # raw pixels, the data set's own 0-16 scale


@pytest.fixture(scope="module")
def trained(member: Api) -> tuple[dict, list[dict]]:
    """A finished 3-epoch digits job that kept all 3 epoch checkpoints."""
    response = member.submit(name="serving-source", epochs=3, checkpoint={"keep": 3})
    assert response.status_code == 201, response.text
    job = member.wait(response.json()["id"], {"SUCCEEDED"}, timeout_s=300)
    checkpoints = member.http.get(f"/v1/jobs/{job['id']}/checkpoints").json()
    assert [c["epoch"] for c in checkpoints] == [1, 2, 3]
    return job, checkpoints


@pytest.fixture(scope="module")
def cleanup(member: Api, ray_cluster) -> Iterator[None]:
    yield
    remove_serving(member, ray_cluster, NAME)


def local_answers(version: dict, config: dict) -> tuple[list[int], torch.Tensor]:
    model = load_model_from_checkpoint(version["checkpoint_path"], "digits", config)
    with torch.no_grad():
        probabilities = torch.softmax(model(torch.tensor(ROWS, dtype=torch.float32)), dim=-1)
    return probabilities.argmax(dim=-1).tolist(), probabilities


def assert_serves(url: str, version: dict, config: dict, headers: dict) -> None:
    """The deployment's answers over HTTP are the local model's, loaded from the same checkpoint."""
    answer = httpx.post(url, json={"inputs": ROWS}, headers=headers, timeout=30).json()
    assert answer["version"] == version["version"], answer
    predictions, probabilities = local_answers(version, config)
    assert answer["predictions"] == predictions
    assert torch.allclose(torch.tensor(answer["probabilities"]), probabilities, atol=1e-5)


class Caller:
    """A bounded client: ``threads`` callers, one request in flight each, until stopped."""

    def __init__(self, url: str, headers: dict, threads: int = 3):
        self.url = url
        self.headers = headers
        self.results: list[tuple[float, int, int | None, str]] = []  # time, status, version, error
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(threads)]

    def _run(self, index: int) -> None:
        with httpx.Client(timeout=30, headers=self.headers) as http:
            while not self._stop.is_set():
                try:
                    response = http.post(self.url, json={"inputs": ROWS[index : index + 2]})
                    version = response.json().get("version") if response.status_code == 200 else None
                    self.results.append((time.monotonic(), response.status_code, version, response.text[:300]))
                except httpx.HTTPError as exc:
                    self.results.append((time.monotonic(), 0, None, repr(exc)))
                time.sleep(0.02)

    def __enter__(self) -> Caller:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)

    def check(self, old: int, new: int) -> None:
        failed = [r for r in self.results if r[1] != 200]
        assert not failed, f"{len(failed)} of {len(self.results)} requests failed: {failed[:3]}"
        # While the rollout surges, old and new replicas both answer; then only the new ones.
        versions = [r[2] for r in sorted(self.results)]
        assert versions[0] == old and versions[-1] == new and set(versions) == {old, new}, set(versions)


def serve_app(cluster) -> dict:
    details = httpx.get(
        f"{cluster.dashboard_url}/api/serve/applications/",
        headers={"Authorization": f"Bearer {cluster.token()}"},
        timeout=30,
    ).json()
    return details["applications"][NAME]


def test_deploy_update_rollback_and_delete_without_a_failed_request(member, admin, trained, cleanup, ray_cluster):
    key = key_headers(member)
    job, checkpoints = trained
    config = job["spec"]["config"]

    # Deploy the job: its best checkpoint by val_accuracy (the latest on a tie).
    created = member.http.post(
        "/v1/deployments",
        json={"name": NAME, "source": {"job_id": job["id"]}, "batching": {"max_batch_size": 8, "wait_ms": 2}},
    )
    assert created.status_code == 201, created.text
    best = max(checkpoints, key=lambda c: (c["metrics"]["val_accuracy"], c["step"]))
    assert created.json()["target"]["checkpoint_path"] == best["path"]
    deployment = member.wait_deployment(NAME, {"HEALTHY"})
    url = deployment["url"]
    assert deployment["serving_version"] == 1 and deployment["serve_status"] == "RUNNING"
    assert [r["state"] for r in deployment["replicas"]] == ["RUNNING"]
    v1 = deployment["current"]
    assert_serves(url, v1, config, key)
    # Serve reports back what was applied, so a steady state sends nothing more (6 reconciler ticks).
    deployed_at = serve_app(ray_cluster)["last_deployed_time_s"]
    time.sleep(3)
    assert serve_app(ray_cluster)["last_deployed_time_s"] == deployed_at, "the config was applied again"

    # Bad inputs: 4xx that say what is expected, never a 500.
    for body, status in [
        ({"inputs": []}, 422),
        ({"inputs": [[1.0] * 63]}, 422),
        ({"inputs": [["x"] * 64]}, 422),
        ({"inputs": [[0.0] * 64] * 257}, 422),
        ({"rows": ROWS}, 422),
        ([1, 2], 422),
    ]:
        response = httpx.post(url, json=body, headers=key, timeout=30)
        assert response.status_code == status, (body if len(str(body)) < 100 else "big", response.text)
        assert "expected" in response.json() and response.json()["detail"]
    assert httpx.post(url, content=b"not json", headers=key, timeout=30).status_code == 400
    # auth: project (the default): no key, or one that is no key of this project (the admin token), is a 401.
    assert deployment["auth"] == "project"
    assert httpx.post(url, json={"inputs": ROWS[:1]}, timeout=30).status_code == 401
    assert httpx.post(url, json={"inputs": ROWS[:1]}, headers=key_headers(admin), timeout=30).status_code == 401

    # Update to another checkpoint while requests keep coming: none fails, the answers switch.
    others = [c for c in checkpoints if c["path"] != best["path"]]
    with Caller(url, key) as caller:
        time.sleep(1)
        patched = member.http.patch(f"/v1/deployments/{NAME}", json={"source": {"checkpoint_id": others[0]["id"]}})
        assert patched.status_code == 200 and patched.json()["state"] == "UPDATING", patched.text
        deployment = member.wait_deployment(NAME, {"HEALTHY"})
        time.sleep(1)
    caller.check(old=1, new=2)
    assert deployment["serving_version"] == 2 and deployment["current"]["checkpoint_path"] == others[0]["path"]
    assert_serves(url, deployment["current"], config, key)

    # Roll back: version 3 serves version 1's checkpoint again, again without a failed request.
    with Caller(url, key) as caller:
        time.sleep(1)
        rolled = member.http.post(f"/v1/deployments/{NAME}/rollback")
        assert rolled.status_code == 200 and rolled.json()["version"] == 3, rolled.text
        deployment = member.wait_deployment(NAME, {"HEALTHY"})
        time.sleep(1)
    caller.check(old=2, new=3)
    assert deployment["current"]["checkpoint_path"] == v1["checkpoint_path"]
    assert deployment["current"]["note"] == "rollback to version 1"
    assert_serves(url, deployment["current"], config, key)

    # A version that cannot load is not promoted: UNHEALTHY with the reason, version 3 keeps serving.
    broken = others[1]
    (Path(broken["path"]) / "model.pt").write_bytes(b"not a state dict")
    with Caller(url, key) as caller:
        member.http.patch(f"/v1/deployments/{NAME}", json={"source": {"checkpoint_id": broken["id"]}})
        deployment = member.wait_deployment(NAME, {"UNHEALTHY"}, timeout_s=180)
        time.sleep(2)
    failed = [r for r in caller.results if r[1] != 200]
    assert not failed and {r[2] for r in caller.results} == {3}, failed[:3]
    assert deployment["reason"] == "health_check_failed" and deployment["serving_version"] == 3
    assert "version 4 was not promoted" in deployment["message"] and "Version 3 keeps serving" in deployment["message"]
    assert_serves(url, deployment["current"], config, key)

    # A version whose replicas would take the project past its CPU quota (a 1-CPU job holds 1 of 1.5) waits
    # QUEUED with the reason while version 3 keeps serving (docs/scheduling.md, "Deployments"); it is deleted
    # while it waits (no rollout).
    holder = member.submit(name="quota-holder", epochs=50, scaling={"num_workers": 1, "cpus_per_worker": 1})
    assert holder.status_code == 201, holder.text
    holder_id = holder.json()["id"]
    quota_url = f"/v1/projects/{deployment['project_id']}/quota"
    try:
        member.wait(holder_id, {"STARTING", "RUNNING"}, timeout_s=60)
        assert admin.http.put(quota_url, json={"max_cpus": 1.5, "borrowing": False}).status_code == 200
        with Caller(url, key) as caller:
            grown = member.http.patch(f"/v1/deployments/{NAME}", json={"resources": {"cpus": 1}})
            assert grown.status_code == 200 and grown.json()["state"] == "QUEUED", grown.text
            deadline = time.monotonic() + 30
            while (deployment := member.http.get(f"/v1/deployments/{NAME}").json())["reason"] != "quota_exceeded":
                assert time.monotonic() < deadline, deployment
                time.sleep(0.5)
            time.sleep(2)
        failed = [r for r in caller.results if r[1] != 200]
        assert not failed and {r[2] for r in caller.results} == {3}, failed[:3]
        assert (deployment["state"], deployment["serving_version"]) == ("QUEUED", 3)
        assert deployment["message"] == (
            "project integration uses 1 of 1.5 CPUs; its version 5 needs 1 more than version 3 holds "
            "(borrowing is off); version 3 keeps serving"
        )

        # Delete: the route is gone (Serve answers 404), the record stays as DELETED.
        deleted = member.http.delete(f"/v1/deployments/{NAME}")
        assert deleted.status_code == 200 and deleted.json()["state"] == "DELETED"
    finally:
        admin.http.put(quota_url, json={})  # the project's quota back to none, for the tests after this one
        member.http.post(f"/v1/jobs/{holder_id}/cancel")
    deadline = time.monotonic() + 60
    while httpx.post(url, json={"inputs": ROWS[:1]}, headers=key, timeout=30).status_code != 404:
        assert time.monotonic() < deadline, "the route still answers 60 s after the delete"
        time.sleep(0.5)
    member.wait(holder_id, {"CANCELLED"}, timeout_s=60)
    history = [e["to_state"] for e in member.http.get(f"/v1/deployments/{NAME}/events").json()]
    assert history == [
        "DEPLOYING",
        "HEALTHY",
        "UPDATING",
        "HEALTHY",
        "UPDATING",
        "HEALTHY",
        "UPDATING",
        "UNHEALTHY",
        "QUEUED",
        "DELETED",
    ]
