"""Two control-plane replicas on one PostgreSQL database and one Ray cluster; kill -9 of the leader while a job
runs, another waits in the queue, a sweep runs and a deployment serves.

Replica A is the shared chaos service, moved onto a fresh PostgreSQL database: it owns the local Ray head (it
started it; the head runs in a session of its own and outlives A). Replica B points at that cluster through
RAY_ADDRESS and never starts Ray. Both share the storage folder, and both give drivers the address of a front
door that forwards to whichever replica is up (as a Kubernetes Service does), so a driver's news reaches the
survivor. The lease is 3 s, so the takeover is due within 6 s.

What must hold: the survivor says ``leader: true`` on /readyz within 2 x lease of the kill; it adopts every
run as a restarted control plane does (the harness's invariants: one Ray submission per attempt, every step
reported, the metrics of a failure-free run, storage matching the database), the queued job is admitted
afterwards by the new leader, the sweep ends with all its trials; the deployment is not redeployed (same
version, same Serve replicas, Serve given no new config) and answered every request sent during the takeover;
both replicas answered every read and write while they ran, the survivor before, during and after the kill.
"""

from __future__ import annotations

import time

import httpx
import pytest
from sklearn.datasets import load_digits

from orchestrator.backend.dashboard import serve_applications
from tests.chaos.conftest import on_postgres
from tests.chaos.harness import TERMINAL, Api, ServiceProcess, wait_until
from tests.chaos.recovery import CHECKPOINT_INTERVAL, CheckpointWatcher, assert_recovered, events_of, parse_time, spec
from tests.chaos.replicas import FrontDoor, Recorder

pytestmark = [pytest.mark.chaos, pytest.mark.postgres]

LEASE_S = 3.0
# 0.45 CPU a worker: the running job (0.9) and the sweep's one trial at a time (0.9 + its driver's share) fit
# the 2-CPU cluster together, and leave too little for the queued job (2 x 0.5) until one of them ends.
SMALL = {"num_workers": 2, "cpus_per_worker": 0.45}
SWEEP = {
    "name": "takeover-sweep",
    "base": {"workload": "digits", "epochs": 1, "batch": {"per_worker": 16}, "scaling": SMALL},
    "search_space": {"lr.base": {"type": "grid", "values": [0.3, 0.2, 0.1]}},
    "algorithm": "grid",
    "max_concurrent_trials": 1,
}
QUEUED = {
    "workload": "digits",
    "name": "takeover-queued",
    "epochs": 1,
    "batch": {"per_worker": 64},
    "scaling": {"num_workers": 2, "cpus_per_worker": 0.5},
}
MODEL = {
    "workload": "digits",
    "name": "takeover-model",
    "epochs": 1,
    "batch": {"per_worker": 64},
    "scaling": {"num_workers": 1},
}
DEPLOYMENT = "takeover"
ROWS = load_digits(return_X_y=True)[0][:4].tolist()


def ready(svc: ServiceProcess) -> dict:
    return httpx.get(f"{svc.url}/readyz", timeout=5).json()


def serve_app(svc: ServiceProcess) -> dict:
    return serve_applications(svc.dashboard_url, svc.headers())["applications"][DEPLOYMENT]


def replica_ids(app: dict) -> list[str]:
    return sorted(r["replica_id"] for d in app["deployments"].values() for r in d["replicas"])


def sweep_of(api: Api, sweep_id: str) -> dict:
    response = api.http.get(f"/v1/sweeps/{sweep_id}")
    response.raise_for_status()
    return response.json()


def trials(api: Api, sweep_id: str) -> list[dict]:
    response = api.http.get(f"/v1/sweeps/{sweep_id}/trials")
    response.raise_for_status()
    return response.json()


def test_kill_of_the_leader_with_two_replicas(shared_service, postgres_server, reference, tmp_path):
    a = shared_service
    b = ServiceProcess(tmp_path / "replica-b")
    door = FrontDoor([a.port, b.port])
    common = {
        "ORCHESTRATOR_LEASE_S": str(LEASE_S),
        "ORCHESTRATOR_PUBLIC_URL": door.url,
        # A RAY_ADDRESS cluster turns Ray Train's preemption watcher on by default: the same runs on both.
        "ORCHESTRATOR_TRAIN_PREEMPTION_WATCHER": "false",
    }
    with on_postgres(a, postgres_server, common) as database_url:
        b.database_url = database_url
        b.settings = {
            **common,
            "RAY_ADDRESS": a.dashboard_url,  # A's cluster: B starts no Ray of its own
            "RAY_AUTH_TOKEN": a.token(),
            "ORCHESTRATOR_STORAGE": str(a.storage),
        }
        b.start()
        try:
            assert (ready(a)["leader"], ready(b)["leader"]) == (True, False), (ready(a), ready(b))
            run_scenario(a, b, reference)
        finally:
            try:  # nothing of the scenario may run on into the next one: the sweep, the deployment, replica B
                admin = a.api() if a.process.poll() is None else b.api()
                for sweep in admin.http.get("/v1/sweeps").json():
                    if sweep["state"] not in TERMINAL:
                        admin.http.post(f"/v1/sweeps/{sweep['id']}/cancel")
                admin.http.delete(f"/v1/deployments/{DEPLOYMENT}")
                # As tests/integration/conftest.py's remove_serving: no Serve application or process left.
                httpx.delete(f"{a.dashboard_url}/api/serve/applications/", headers=a.headers(), timeout=60)
            finally:
                b.stop()
                door.close()


def run_scenario(a: ServiceProcess, b: ServiceProcess, reference: dict) -> None:
    api = a.api()
    # A model to serve, then the deployment, its caller's key made first (a new key of the deployment's project
    # changes the Serve config: none is made once it serves).
    model = api.wait(api.submit(MODEL)["id"], {"SUCCEEDED"}, timeout_s=240)
    key = api.http.post(f"/v1/projects/{model['project_id']}/keys", json={"role": "viewer", "name": "caller"})
    assert key.status_code == 201, key.text
    caller_headers = {"Authorization": f"Bearer {key.json()['key']}"}
    created = api.http.post("/v1/deployments", json={"name": DEPLOYMENT, "source": {"job_id": model["id"]}})
    assert created.status_code == 201, created.text

    # While it rolls out: the scenario's job and the sweep, admitted together; then a job that does not fit.
    running = api.submit(spec("takeover-running", scaling=SMALL))["id"]
    response = api.http.post("/v1/sweeps", json=SWEEP)
    assert response.status_code == 201, response.text
    sweep_id = response.json()["id"]
    watcher = CheckpointWatcher(api, running)
    wait_until(lambda: api.job(running)["state"] != "QUEUED", 120, "the running job's admission")
    wait_until(lambda: sweep_of(api, sweep_id)["state"] != "QUEUED", 120, "the sweep's admission")
    queued = api.submit(QUEUED)["id"]

    deployment = wait_until(
        lambda: (d := api.http.get(f"/v1/deployments/{DEPLOYMENT}").json())["state"] == "HEALTHY" and d,
        180,
        "the deployment to be HEALTHY",
    )
    url = deployment["url"]
    app_before = serve_app(a)
    assert app_before["status"] == "RUNNING" and replica_ids(app_before), app_before

    def predict(http: httpx.Client, _: str) -> httpx.Response:
        return http.post(url, json={"inputs": ROWS})

    def read(http: httpx.Client, _: str) -> httpx.Response:
        return http.get(f"/v1/jobs/{running}")

    def write(http: httpx.Client, n: str) -> httpx.Response:
        return http.post("/v1/projects", json={"name": f"probe-{http.base_url.port}-{n}"})

    admin = {"Authorization": f"Bearer {a.admin_token}"}
    with (
        Recorder(url, caller_headers, {"predict": predict}, threads=2, pause_s=0.05) as caller,
        Recorder(a.url, admin, {"read": read, "write": write}) as probe_a,
        Recorder(b.url, admin, {"read": read, "write": write}) as probe_b,
    ):
        api.wait_for_step(running, 3 * CHECKPOINT_INTERVAL)
        wait_until(lambda: any(t["state"] == "RUNNING" for t in trials(api, sweep_id)), 180, "a running trial")
        job = api.job(queued)
        assert job["state"] == "QUEUED" and job["reason"] == "insufficient_resources", job
        assert sweep_of(api, sweep_id)["state"] == "RUNNING"
        assert api.job(running)["state"] == "RUNNING"

        leaders = [svc for svc in (a, b) if ready(svc)["leader"]]
        assert len(leaders) == 1, (ready(a), ready(b))
        leader, survivor = (a, b) if leaders[0] is a else (b, a)
        probe_of = {id(a): probe_a, id(b): probe_b}
        killed_at = time.time()  # just before: an answer that came back earlier cannot have been hurt by the kill
        leader.kill()
        wait_until(lambda: ready(survivor)["leader"], 4 * LEASE_S, "the other replica to lead", interval_s=0.1)
        took_over_s = time.time() - killed_at
        assert took_over_s <= 2 * LEASE_S, f"the survivor led {took_over_s:.1f} s after the kill (lease {LEASE_S} s)"

        api = survivor.api()
        assert_recovered(a, api, running, reference, [], watcher.stop(), attempts=range(1, 2))
        job = api.wait(queued, {"SUCCEEDED"}, timeout_s=240)
        deadline = time.monotonic() + 240
        while (sweep := sweep_of(api, sweep_id))["state"] not in TERMINAL:
            assert time.monotonic() < deadline, sweep
            time.sleep(0.5)
        after = time.time()

    # No run lost or submitted twice; the queued job was admitted by the new leader, after the kill.
    assert a.submissions(running) == [f"{running}-1"]
    assert not [e for e in events_of(api, running) if e[0] == "RESTARTING"], events_of(api, running)
    assert a.submissions(queued) == [f"{queued}-1"] and job["attempt"] == 1
    admitted = [parse_time(e["created_at"]) for e in api.events(queued) if e["to_state"] == "STARTING"]
    assert len(admitted) == 1 and admitted[0] > killed_at, (admitted, killed_at)
    assert sweep["state"] == "SUCCEEDED" and sweep["attempt"] == 1, sweep
    assert a.submissions(sweep_id) == [f"{sweep_id}-1"]
    done = trials(api, sweep_id)
    assert [(t["state"], t["iterations"]) for t in done] == [("SUCCEEDED", 1)] * 3, done
    jobs = sorted(j["name"] for j in api.jobs() if j["name"] and j["name"].startswith("takeover"))
    assert jobs == ["takeover-model", "takeover-queued", "takeover-running"], jobs

    # The deployment: the same version on the same replicas; Serve got no new config; every request answered.
    deployment = api.http.get(f"/v1/deployments/{DEPLOYMENT}").json()
    assert (deployment["state"], deployment["version"], deployment["serving_version"]) == ("HEALTHY", 1, 1)
    app_after = serve_app(a)
    assert replica_ids(app_after) == replica_ids(app_before), (app_before, app_after)
    assert app_after["last_deployed_time_s"] == app_before["last_deployed_time_s"], "Serve was given a new config"
    failed = caller.failed({200})
    assert not failed, f"{len(failed)} of {len(caller.answers)} requests to the deployment failed: {failed[:3]}"
    during = caller.between(killed_at, killed_at + took_over_s)
    assert during, "no request to the deployment was answered during the takeover"

    # Both replicas answered reads and writes while they ran: the leader until its kill, the survivor always.
    problems = probe_of[id(leader)].failed({200, 201}, until=killed_at) + probe_of[id(survivor)].failed({200, 201})
    assert not problems, problems[:5]
    for what in ("read", "write"):
        assert probe_of[id(leader)].between(0, killed_at, what), f"the leader answered no {what} before its kill"
        assert probe_of[id(survivor)].between(killed_at, killed_at + took_over_s, what), (
            f"the survivor answered no {what} during the takeover"
        )
        assert probe_of[id(survivor)].between(killed_at + took_over_s, after, what)
    print(
        f"takeover {took_over_s:.1f} s; {len(caller.answers)} deployment requests ({len(during)} during it); "
        f"probes: {len(probe_a.answers)} on A, {len(probe_b.answers)} on B"
    )
