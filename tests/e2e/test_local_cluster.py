"""deploy/local-cluster.sh: a Ray head + a second Ray node + PostgreSQL + the control plane, as processes.

A 2-worker digits job on two 1-CPU nodes must put one training worker on each node; the proof is the
Ray State API's actor list (RayTrainWorker actors of the job's Ray job, with their node ids). Then
`stop` must leave nothing running.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
import uuid
from pathlib import Path

import httpx
import psycopg
import pytest

from tests.conftest import free_port
from tests.ray_state import state_api

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "deploy" / "local-cluster.sh"
ADMIN = "local-cluster-admin-token"
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}
PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"


def _run(action: str, env: dict[str, str], timeout_s: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SCRIPT), action], env=env, capture_output=True, text=True, timeout=timeout_s, cwd=ROOT
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/status")
    return not (status.exists() and "\nState:\tZ" in status.read_text())


def _session_members(sid: int) -> list[int]:
    """Live processes whose session id is ``sid`` (each component runs in its own session)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # After the command: state, ppid, pgrp, session, ...
        if int(fields[3]) == sid and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_a_two_worker_job_spans_both_ray_nodes_and_stop_leaves_nothing(tmp_path):
    state = tmp_path / "local-cluster"
    database = f"orch_e2e_{uuid.uuid4().hex[:12]}"
    api_port, gcs_port, dashboard_port = free_port(), free_port(), free_port()
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "ORCHESTRATOR_", "PYTEST", "LOCAL_CLUSTER_"))
    }
    env.update(
        LOCAL_CLUSTER_DIR=str(state),
        LOCAL_CLUSTER_DB=database,
        LOCAL_CLUSTER_API_PORT=str(api_port),
        LOCAL_CLUSTER_GCS_PORT=str(gcs_port),
        LOCAL_CLUSTER_DASHBOARD_PORT=str(dashboard_port),
        LOCAL_CLUSTER_CLIENT_PORT=str(free_port()),
        ORCHESTRATOR_ADMIN_TOKEN=ADMIN,
        OMP_NUM_THREADS="1",
    )
    base, dashboard = f"http://127.0.0.1:{api_port}", f"http://127.0.0.1:{dashboard_port}"
    pids: dict[str, int] = {}
    try:
        started = _run("start", env, timeout_s=300)
        pids = {p.stem: int(p.read_text()) for p in (state / "pids").glob("*.pid")}
        assert started.returncode == 0, f"start failed:\n{started.stdout}\n{started.stderr}"
        assert set(pids) == {"head", "worker", "api"}
        token = (state / "ray" / "auth_token").read_text().strip()

        nodes = state_api(dashboard, token, "nodes", state="ALIVE")
        assert len(nodes) == 2 and all(n["resources_total"]["CPU"] == 1.0 for n in nodes), nodes
        # The Ray dashboard is behind the token: no token, no answer.
        assert httpx.get(f"{dashboard}/api/v0/nodes", timeout=10).status_code in (401, 403)

        api = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30)
        ready = api.get("/readyz")  # the script waited for both: the database (the 200) and Ray
        assert ready.status_code == 200 and ready.json()["ray"].startswith("ok"), ready.text
        response = api.post("/v1/jobs", json={"workload": "digits", "epochs": 2, "scaling": {"num_workers": 2}})
        assert response.status_code == 201, response.text
        job_id = response.json()["id"]
        deadline = time.monotonic() + 240
        while (job := api.get(f"/v1/jobs/{job_id}").json())["state"] not in TERMINAL:
            assert time.monotonic() < deadline, f"job not done after 240 s: {job}"
            time.sleep(1)
        assert job["state"] == "SUCCEEDED", job
        assert job["result"]["metrics"]["val_accuracy"] > 0.5

        # The Ray job of attempt 1, and the training workers its driver's TorchTrainer created.
        ray_job = httpx.get(
            f"{dashboard}/api/jobs/{job_id}-{job['attempt']}", headers={"Authorization": f"Bearer {token}"}, timeout=30
        ).json()
        workers = state_api(dashboard, token, "actors", class_name="RayTrainWorker", job_id=ray_job["job_id"])
        assert len(workers) == 2, workers
        assert {w["node_id"] for w in workers} == {n["node_id"] for n in nodes}, (workers, nodes)
    finally:
        stopped = _run("stop", env, timeout_s=180)
        try:
            with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        except psycopg.Error:
            pass
    assert stopped.returncode == 0, f"stop failed:\n{stopped.stdout}\n{stopped.stderr}"
    for name, pid in pids.items():
        assert not _alive(pid), f"{name} (pid {pid}) still runs after stop"
        assert not _session_members(pid), f"processes of {name} still run after stop: {_session_members(pid)}"
    for port in (api_port, gcs_port, dashboard_port):
        assert not _listening(port), f"port {port} still open after stop"
    assert not list((state / "pids").glob("*.pid"))
    status = _run("status", env, timeout_s=60)
    assert status.returncode != 0 and "head: stopped" in status.stdout, status.stdout


@pytest.mark.parametrize("action", ["", "restart"])
def test_the_script_rejects_an_unknown_action(action):
    result = subprocess.run(["bash", str(SCRIPT), action], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and "usage" in result.stderr
