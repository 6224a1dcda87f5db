"""One real local Ray cluster for the session, and the real service on a real port in front of it."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from api.embedded import serve_in_thread
from orchestrator.backend.local_cluster import LocalRayCluster
from orchestrator.backend.ray_backend import RayBackend
from orchestrator.settings import Settings
from tests.conftest import cuda_device_count, free_port

ADMIN = "integration-admin-token"
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}
# Short enough for test_failure_causes_on_ray.py to see a stuck job fail; a normal start takes ~15 s.
START_TIMEOUT_S = 60.0


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory) -> Iterator[LocalRayCluster]:
    cluster = LocalRayCluster(
        tmp_path_factory.mktemp("ray-var"),
        gcs_port=free_port(),
        dashboard_port=free_port(),
        client_port=free_port(),
        num_cpus=2,
        num_gpus=cuda_device_count(),  # the machine's GPUs: use_gpu jobs run where there are some
    )
    cluster.start()
    try:
        _check_it_runs_a_task(cluster)
        yield cluster
    finally:
        cluster.stop()


# A Ray job that runs a task and passes 1 MiB through the object store: what every test here needs of the cluster.
CANARY = (
    "python -c 'import ray; ray.init(); big = ray.put(bytes(2**20)); "
    'print("canary", ray.get(ray.remote(lambda b: len(b) // 2**14 - 22).remote(big)))\''
)


def _check_it_runs_a_task(cluster: LocalRayCluster, timeout_s: float = 120) -> None:
    """Stop the whole suite at once, with Ray's own words, when the fresh cluster cannot run a task (no memory,
    a broken install): otherwise every test fails only after its own wait, with no cause."""
    from ray.job_submission import JobStatus, JobSubmissionClient

    client = JobSubmissionClient(cluster.dashboard_url, headers={"Authorization": f"Bearer {cluster.token()}"})
    submission_id = client.submit_job(entrypoint=CANARY)
    deadline = time.monotonic() + timeout_s
    while (status := client.get_job_status(submission_id)) not in (JobStatus.SUCCEEDED, JobStatus.FAILED):
        if time.monotonic() > deadline or status == JobStatus.STOPPED:
            break
        time.sleep(0.5)
    logs = client.get_job_logs(submission_id)
    if status != JobStatus.SUCCEEDED or "canary 42" not in logs:
        info = client.get_job_info(submission_id)
        pytest.exit(
            f"the tests' Ray cluster cannot run a task: its canary job is {status} after at most {timeout_s:.0f} s "
            f"({info.message}); its output ends:\n{logs[-3000:]}",
            returncode=3,
        )


class Api:
    """A thin HTTP client for the tests: real requests to the running service."""

    def __init__(self, base_url: str, key: str):
        self.http = httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {key}"}, timeout=30)

    def submit(self, headers: dict | None = None, **spec) -> httpx.Response:
        return self.http.post("/v1/jobs", json={"workload": "digits", **spec}, headers=headers or {})

    def job(self, job_id: str) -> dict:
        response = self.http.get(f"/v1/jobs/{job_id}")
        response.raise_for_status()
        return response.json()

    def wait(self, job_id: str, states: set[str], timeout_s: float = 300) -> dict:
        """Poll until the job is in one of ``states``; a job that ends elsewhere fails the test at once."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            job = self.job(job_id)
            if job["state"] in states:
                return job
            if job["state"] in TERMINAL:
                pytest.fail(f"job ended {job['state']} ({job['reason']}): {job['message'][-3000:]}")
            time.sleep(0.5)
        pytest.fail(f"job {job_id} not in {states} after {timeout_s} s: {self.job(job_id)}")

    def wait_deployment(self, name: str, states: set[str], timeout_s: float = 120) -> dict:
        """Poll until the deployment is in one of ``states``; FAILED or DELETED, unless asked for, fail at once."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            deployment = self.http.get(f"/v1/deployments/{name}").json()
            if deployment["state"] in states:
                return deployment
            if deployment["state"] in {"FAILED", "DELETED"} - states:
                pytest.fail(f"deployment ended {deployment['state']} ({deployment['reason']}): {deployment['message']}")
            time.sleep(0.5)
        pytest.fail(
            f"deployment not in {states} after {timeout_s} s: {self.http.get(f'/v1/deployments/{name}').json()}"
        )


def key_headers(api: Api) -> dict[str, str]:
    """The ``Authorization`` header of ``api``'s key: a deployment (``auth: project``, the default) answers a
    key of its own project only."""
    return {"Authorization": api.http.headers["Authorization"]}


def project_key_headers(admin: Api, project_id: str) -> dict[str, str]:
    """A new viewer key of ``project_id`` as an ``Authorization`` header (the admin token is no project key)."""
    response = admin.http.post(f"/v1/projects/{project_id}/keys", json={"role": "viewer", "name": "serving"})
    response.raise_for_status()
    return {"Authorization": f"Bearer {response.json()['key']}"}


def remove_serving(api: Api, cluster: LocalRayCluster, name: str) -> None:
    """Leave the session's cluster as the other tests expect it: no deployment, no Serve processes."""
    api.http.delete(f"/v1/deployments/{name}")
    httpx.delete(
        f"{cluster.dashboard_url}/api/serve/applications/",
        headers={"Authorization": f"Bearer {cluster.token()}"},
        timeout=60,
    )


@pytest.fixture(scope="session")
def service_settings(tmp_path_factory) -> Settings:
    """The session service's settings: the very object its loops read, so a test may change one for a while
    (``monkeypatch.setattr``), e.g. a shorter start timeout while only its own stuck job runs."""
    root = tmp_path_factory.mktemp("service")
    return Settings(
        database_url=f"sqlite:///{root / 'orchestrator.db'}",
        storage=str(root / "storage"),
        var_dir=str(root / "var"),
        host="127.0.0.1",
        port=free_port(),
        admin_token=ADMIN,
        scheduler_interval_s=0.5,
        reconciler_interval_s=1.0,
        train_poll_interval_s=0.2,
        start_timeout_s=START_TIMEOUT_S,
        workload_packages="example_workloads",  # examples/, installed by `make install`
        data_roots=str(tmp_path_factory.getbasetemp()),  # the tests' text files
        cluster_token_dir=str(tmp_path_factory.getbasetemp()),  # test_clusters_on_ray's second cluster's token
        serve_port=free_port(),
        serve_reconciler_interval_s=0.5,  # Ray Serve's proxy: a free port
    )


@pytest.fixture(scope="session")
def service(ray_cluster, service_settings) -> Iterator[str]:
    with serve_in_thread(service_settings, RayBackend(ray_cluster.dashboard_url, ray_cluster.token())) as url:
        yield url


@pytest.fixture(scope="session")
def admin(service) -> Api:
    return Api(service, ADMIN)


@pytest.fixture(scope="session")
def member(service, admin) -> Api:
    project = admin.http.post("/v1/projects", json={"name": "integration"}).json()
    key = admin.http.post(f"/v1/projects/{project['id']}/keys", json={"role": "member"}).json()["key"]
    return Api(service, key)
