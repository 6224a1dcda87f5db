"""Two real Ray clusters behind the session's service (docs/clusters.md): the session's cluster is the default one
("local"), and a second 1-CPU cluster "b" with a token and a Serve port of its own is registered through the API. A
project bound to b runs there (its checkpoints on b's own storage_root) and never on the default cluster; naming the
default cluster is a 422; its model is deployed on b's Serve, not the default cluster's; b's Ray refuses the default
cluster's token; labels, and a project's cap on the default cluster, place runs on b, where fair share puts a newcomer
project's run before the second run of a project already running there; a Ray job submitted to b directly is listed
as foreign and its CPU is not admitted twice; with b down, a run for b waits (cluster_unavailable) and runs once b is
back, while the default cluster goes on, and the run b's head stopped under is recovered by its next attempt. The
module deregisters b when it ends."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from orchestrator.backend.local_cluster import LocalRayCluster
from orchestrator.backend.ray_backend import RayBackend
from tests.conftest import free_port
from tests.integration.conftest import Api, key_headers, remove_serving
from tests.ray_state import state_api

pytestmark = pytest.mark.integration

ONE_CPU = {"num_workers": 1, "cpus_per_worker": 1.0}


@pytest.fixture(scope="module")
def cluster_b(tmp_path_factory):
    cluster = LocalRayCluster(
        tmp_path_factory.mktemp("ray-b"),
        gcs_port=free_port(),
        dashboard_port=free_port(),
        client_port=free_port(),
        num_cpus=1,
        num_gpus=0,
    )
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def b_storage(tmp_path_factory) -> Path:
    """Cluster b's storage_root: its runs' folders are here, not on the service's storage."""
    return tmp_path_factory.mktemp("b-storage")


@pytest.fixture(scope="module")
def on_b(admin: Api, cluster_b: LocalRayCluster, b_storage: Path) -> Iterator[tuple[str, Api]]:
    """Cluster b registered (its token read from its file, its own storage_root), and a project bound to it alone,
    with a member key."""
    body = {
        "name": "b",
        "address": cluster_b.dashboard_url,
        "token_ref": f"file:{cluster_b.token_path}",
        "storage_root": str(b_storage),
        "serve_port": free_port(),  # the default cluster's Serve has ORCHESTRATOR_SERVE_PORT on this host
    }
    # Shared: test_labels_a_cap_on_the_default_cluster_and_fair_share_on_b binds more projects to it (that a
    # dedicated cluster refuses one: tests/unit/test_clusters_api.py).
    registered = admin.http.post("/v1/clusters", json={**body, "labels": {"pool": "b"}, "tenancy": "shared"})
    assert registered.status_code == 201, registered.text
    assert cluster_b.token() not in registered.text  # only where it is read
    project = admin.http.post("/v1/projects", json={"name": "team-b"}).json()
    bound = admin.http.put(f"/v1/projects/{project['id']}/clusters", json={"clusters": ["b"]})
    assert bound.status_code == 200 and [c["name"] for c in bound.json()["clusters"]] == ["b"], bound.text
    key = admin.http.post(f"/v1/projects/{project['id']}/keys", json={"role": "member"}).json()["key"]
    yield project["id"], Api(str(admin.http.base_url), key)
    # The session's service as the other tests expect it: one cluster, nothing asked of a b that is gone.
    admin.http.put(f"/v1/projects/{project['id']}/clusters", json={"clusters": ["local"]}).raise_for_status()
    deleted = admin.http.delete("/v1/clusters/b")
    assert deleted.status_code == 204, deleted.text


def ray_jobs(cluster: LocalRayCluster) -> set[str]:
    """The submission ids a cluster's Ray lists."""
    response = httpx.get(
        f"{cluster.dashboard_url}/api/jobs/", headers={"Authorization": f"Bearer {cluster.token()}"}, timeout=30
    )
    response.raise_for_status()
    return {job["submission_id"] for job in response.json() if job.get("submission_id")}


@pytest.fixture(scope="module")
def trained_on_b(on_b) -> dict:
    """A 1-epoch digits job of the project bound to b, finished."""
    _, member = on_b
    response = member.submit(name="on-b", epochs=1, scaling=ONE_CPU)
    assert response.status_code == 201, response.text
    return member.wait(response.json()["id"], {"SUCCEEDED"}, timeout_s=240)


def test_a_project_bound_to_b_runs_on_b_only_and_may_not_name_the_default(
    on_b, trained_on_b, ray_cluster, cluster_b, b_storage, service_settings
):
    _, member = on_b
    refused = member.submit(epochs=1, scaling=ONE_CPU, placement={"cluster": "local"})
    assert refused.status_code == 422 and "may use: b (pool=b)" in refused.text, refused.text
    job_id = trained_on_b["id"]
    assert trained_on_b["cluster"] == "b"
    assert f"{job_id}-1" in ray_jobs(cluster_b) and f"{job_id}-1" not in ray_jobs(ray_cluster)
    logs = member.http.get(f"/v1/jobs/{job_id}/logs")  # read from b's Ray (or its archive)
    assert logs.status_code == 200 and logs.text.strip()
    # Its checkpoints are in its run folder on b's storage_root; nothing of it is on the service's storage.
    checkpoints = member.http.get(f"/v1/jobs/{job_id}/checkpoints").json()
    assert checkpoints and all(Path(c["path"]).parent == b_storage / job_id for c in checkpoints), checkpoints
    assert not (Path(service_settings.storage_path) / job_id).exists()


def serve_apps(cluster: LocalRayCluster) -> set[str]:
    """The applications a cluster's Ray Serve runs."""
    response = httpx.get(
        f"{cluster.dashboard_url}/api/serve/applications/",
        headers={"Authorization": f"Bearer {cluster.token()}"},
        timeout=30,
    )
    return set(response.json().get("applications") or {}) if response.status_code == 200 else set()


def test_a_deployment_of_bs_project_is_served_by_bs_serve_on_its_own_port(
    on_b, admin, trained_on_b, ray_cluster, cluster_b
):
    """The project bound to b deploys its model: it is placed on b, b's Serve runs it on b's serve_port (the default
    cluster's Serve never has it) and it answers there; naming the default cluster is a 422."""
    _, member = on_b
    checkpoint = member.http.get(f"/v1/jobs/{trained_on_b['id']}/checkpoints").json()[-1]
    body = {"name": "digits-on-b", "source": {"checkpoint_id": checkpoint["id"]}, "resources": {"cpus": 0.5}}
    refused = member.http.post("/v1/deployments", json={**body, "placement": {"cluster": "local"}})
    assert refused.status_code == 422 and "may use: b (pool=b)" in refused.text, refused.text
    created = member.http.post("/v1/deployments", json=body)
    assert created.status_code == 201, created.text
    try:
        deployment = member.wait_deployment("digits-on-b", {"HEALTHY"}, timeout_s=240)
        serve_port = admin.http.get("/v1/clusters/b").json()["serve_port"]
        assert deployment["cluster"] == "b" and deployment["url"] == f"http://127.0.0.1:{serve_port}/digits-on-b"
        assert "digits-on-b" in serve_apps(cluster_b) and "digits-on-b" not in serve_apps(ray_cluster)
        answer = httpx.post(deployment["url"], json={"inputs": [[0.0] * 64]}, headers=key_headers(member), timeout=60)
        assert answer.status_code == 200 and len(answer.json()["predictions"]) == 1, answer.text
    finally:
        remove_serving(member, cluster_b, "digits-on-b")  # b's Serve stopped: its CPU back for the next tests


def test_code_on_the_default_cluster_holds_nothing_b_accepts(on_b, ray_cluster, cluster_b):
    """What a worker on the default cluster holds (its Ray token) is refused by b's Ray; b's runs are not in the
    default cluster's job table, so no claim code or token of b's can be read from it."""
    assert ray_cluster.token() != cluster_b.token()
    refused = httpx.get(
        f"{cluster_b.dashboard_url}/api/jobs/", headers={"Authorization": f"Bearer {ray_cluster.token()}"}, timeout=30
    )
    assert refused.status_code in (401, 403), refused.status_code
    assert not any(sid for sid in ray_jobs(ray_cluster) if sid in ray_jobs(cluster_b))


def test_labels_a_cap_on_the_default_cluster_and_fair_share_on_b(on_b, admin, ray_cluster, cluster_b):
    """A project that may use both clusters: placement by labels puts a run on b, and so does its cap of 0 CPUs on
    the default cluster (``per_cluster``) for a run that names nothing. Fair share on b (1 CPU): a newcomer project's
    run, submitted after both, starts before the second of them (its project already has b's CPU)."""
    both = bound_project(admin, "both", ["b", "local"], {"borrowing": False, "per_cluster": {"local": {"max_cpus": 0}}})
    by_labels = both.submit(name="by-labels", epochs=1, scaling=ONE_CPU, placement={"labels": {"pool": "b"}})
    assert by_labels.status_code == 201, by_labels.text
    both.wait(by_labels.json()["id"], {"RUNNING"}, timeout_s=240)  # its project holds b's only CPU
    by_cap = both.submit(name="by-cap", epochs=1, scaling=ONE_CPU)
    newcomer = bound_project(admin, "newcomer", ["b", "local"])
    its_run = newcomer.submit(name="newcomer-on-b", epochs=1, scaling=ONE_CPU, placement={"cluster": "b"})
    assert by_cap.status_code == 201 and its_run.status_code == 201, (by_cap.text, its_run.text)
    done = {}
    for api, response in ((both, by_labels), (both, by_cap), (newcomer, its_run)):
        job_id = response.json()["id"]
        done[job_id] = api.wait(job_id, {"SUCCEEDED"}, timeout_s=360)
        assert done[job_id]["cluster"] == "b"
        assert f"{job_id}-1" in ray_jobs(cluster_b) and f"{job_id}-1" not in ray_jobs(ray_cluster)
    started = sorted(done.values(), key=lambda job: job["started_at"])
    assert [job["name"] for job in started] == ["by-labels", "newcomer-on-b", "by-cap"], started


def bound_project(admin: Api, name: str, clusters: list[str], quota: dict | None = None) -> Api:
    """A new project bound to ``clusters`` (with ``quota``, if given), as a member key."""
    project = admin.http.post("/v1/projects", json={"name": name}).json()
    bound = admin.http.put(f"/v1/projects/{project['id']}/clusters", json={"clusters": clusters})
    assert bound.status_code == 200, bound.text
    if quota is not None:
        assert admin.http.put(f"/v1/projects/{project['id']}/quota", json=quota).status_code == 200
    key = admin.http.post(f"/v1/projects/{project['id']}/keys", json={"role": "member"}).json()["key"]
    return Api(str(admin.http.base_url), key)


def test_a_ray_job_submitted_to_b_directly_is_listed_and_its_cpu_is_not_admitted_twice(on_b, admin, cluster_b):
    """Someone with b's token submits to b's Ray directly (a 1-CPU driver; b has 1 CPU): GET /v1/cluster lists it as
    foreign on b to an admin, with the CPU it holds, and a run for b waits for that CPU until the job ends."""
    _, member_b = on_b
    ray = RayBackend(cluster_b.dashboard_url, cluster_b.token())
    ray.client.submit_job(entrypoint="sleep 600", submission_id="someones-notebook", entrypoint_num_cpus=1)
    try:
        deadline = time.monotonic() + 60
        while not (b := cluster_named(admin, "b"))["foreign"] or not b["held_outside"]:
            assert time.monotonic() < deadline, b
            time.sleep(0.5)
        assert [(f["id"], f["kind"], f["holds"]) for f in b["foreign"]] == [
            ("someones-notebook", "submission", {"CPU": 1.0})
        ]
        assert b["available"]["CPU"] == 0.0
        assert cluster_named(member_b, "b")["foreign"] == []  # a member sees the sum only
        job_id = member_b.submit(name="after-the-notebook", epochs=1, scaling=ONE_CPU).json()["id"]
        deadline = time.monotonic() + 60
        while (job := member_b.job(job_id))["reason"] != "insufficient_resources":
            assert job["state"] == "QUEUED" and time.monotonic() < deadline, job
            time.sleep(0.5)
        assert "1 CPU held by Ray jobs the control plane did not submit" in job["message"], job["message"]
    finally:
        ray.stop("someones-notebook")
    assert member_b.wait(job_id, {"SUCCEEDED"}, timeout_s=240)["cluster"] == "b"


def training_processes(cluster: LocalRayCluster, submission_id: str) -> list[int]:
    """The pids of a submission's driver and of its Train workers, once the workers are up."""
    headers = {"Authorization": f"Bearer {cluster.token()}"}
    deadline = time.monotonic() + 120
    while not (
        workers := state_api(
            cluster.dashboard_url, cluster.token(), "actors", class_name="RayTrainWorker", state="ALIVE"
        )
    ):
        assert time.monotonic() < deadline, "no Train worker came up"
        time.sleep(0.2)
    job = httpx.get(f"{cluster.dashboard_url}/api/jobs/{submission_id}", headers=headers, timeout=30).json()
    return [int(job["driver_info"]["pid"]), *(int(w["pid"]) for w in workers if w.get("pid"))]


def cluster_named(api: Api, name: str) -> dict:
    response = api.http.get("/v1/cluster")
    response.raise_for_status()
    return next(c for c in response.json()["clusters"] if c["name"] == name)


def test_with_b_down_its_runs_wait_and_recover_once_b_is_back(on_b, cluster_b, member):
    """b's head stops under a running run of b's: a run submitted meanwhile waits (cluster_unavailable) while the
    default cluster goes on; once b is back (a new head, none of the old Ray jobs), the running run is recovered by
    its next attempt and the waiting one runs, both on b."""
    _, member_b = on_b
    running = member_b.submit(name="running-when-b-stops", epochs=3, scaling=ONE_CPU).json()["id"]
    member_b.wait(running, {"RUNNING"}, timeout_s=240)
    # The run dies with b, as under `ray stop --force`: its driver and workers first (Ray starts them outside the
    # head's process group, and they would train on through the head's slow SIGTERM), then the head.
    for pid in training_processes(cluster_b, f"{running}-1"):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    cluster_b.stop()
    try:
        response = member_b.submit(name="while-b-is-down", epochs=1, scaling=ONE_CPU)
        assert response.status_code == 201, response.text  # capacity could not be asked: accepted, it waits
        job_id = response.json()["id"]
        deadline = time.monotonic() + 60
        while (job := member_b.job(job_id))["reason"] != "cluster_unavailable":
            assert job["state"] == "QUEUED" and time.monotonic() < deadline, job
            time.sleep(0.5)
        assert "b" in job["message"]
        # The default cluster goes on meanwhile.
        other = member.submit(name="default-goes-on", epochs=1, scaling=ONE_CPU).json()["id"]
        assert member.wait(other, {"SUCCEEDED"}, timeout_s=240)["cluster"] == "local"
    finally:
        cluster_b.restart()
    recovered = member_b.wait(running, {"SUCCEEDED"}, timeout_s=300)
    assert recovered["cluster"] == "b" and recovered["attempt"] >= 2, recovered
    done = member_b.wait(job_id, {"SUCCEEDED"}, timeout_s=240)
    assert done["cluster"] == "b" and RayBackend(cluster_b.dashboard_url, cluster_b.token()).info(f"{job_id}-1")
