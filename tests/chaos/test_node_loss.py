"""A node of a multi-node cluster goes away (its raylet killed): Ray Train replaces the worker group
on the nodes left and the job resumes from its latest checkpoint, within the same attempt. And a bad node (one
blamed for hangs and stragglers) is kept out of the next job's placement.

The cluster: the service's own head with 1 CPU, plus two more nodes of 1 CPU each (`ray start
--address=<head>` on this machine), so the job's 2 workers must sit on two different nodes, and after
one node is lost the two that remain still hold a worker group.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from orchestrator.db.models import NodeFault
from tests.chaos.harness import BIN, ServiceProcess, free_port, session_members, wait_until
from tests.chaos.recovery import CheckpointWatcher, assert_recovered, events_of, inject, spec
from tests.ray_state import state_api

pytestmark = pytest.mark.chaos


class ExtraNode:
    """``ray start --address`` of one more node on this machine, in a session of its own."""

    def __init__(self, svc: ServiceProcess, name: str):
        env = {
            **svc.env(),
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": str(svc.var / "ray" / "auth_token"),
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        }
        command = [
            str(BIN / "ray"),
            "start",
            "--block",
            "--address",
            svc.gcs_address,
            "--node-ip-address",
            "127.0.0.1",
            "--num-cpus",
            "1",
            "--num-gpus",
            "0",
            "--object-store-memory",
            str(200 * 1024**2),
            "--disable-usage-stats",
        ]
        # Two nodes on one machine: every port Ray would otherwise pick for itself, picked here, so
        # the nodes cannot race each other (or another cluster) for the same one.
        for option in (
            "--dashboard-agent-listen-port",
            "--dashboard-agent-grpc-port",
            "--metrics-export-port",
            "--node-manager-port",
            "--object-manager-port",
            "--runtime-env-agent-port",
        ):
            command += [option, str(free_port())]
        self.log = svc.root / f"node-{name}.log"
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def raylet_pid(self) -> int | None:
        for pid in session_members(self.process.pid):
            if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].endswith(b"/raylet"):
                return pid
        return None

    def stop(self) -> None:
        for pid in session_members(self.process.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.process.wait(30)


@pytest.fixture
def three_nodes(no_shared_cluster, reference, tmp_path) -> Iterator[tuple[ServiceProcess, list[ExtraNode]]]:
    svc = ServiceProcess(tmp_path / "service", num_cpus=1)
    svc.start()
    nodes: list[ExtraNode] = []
    try:
        for name in ("b", "c"):  # one at a time: each joins before the next starts
            nodes.append(ExtraNode(svc, name))
            wait_until(lambda: len(svc.alive_nodes()) == len(nodes) + 1, 90, f"node {name} to join")
        yield svc, nodes
    finally:
        for node in nodes:
            node.stop()
        svc.stop()


def _worker_pids(svc: ServiceProcess) -> set[int]:
    return set(svc.train_worker_pids())


def test_losing_a_node_restarts_the_worker_group_on_the_nodes_left(three_nodes, reference):
    svc, nodes = three_nodes
    api = svc.api()
    job_id = api.submit(spec("node-loss"))["id"]
    watcher = CheckpointWatcher(api, job_id)
    api.wait_for_step(job_id, 35)
    workers = wait_until(lambda: len(_worker_pids(svc)) == 2 and _worker_pids(svc), 30, "two placed workers")
    # The head has 1 CPU, so at least one worker runs on an extra node: its processes are in that
    # node's session (its raylet started them). That node goes, not the head with the driver.
    victim = next(node for node in nodes if workers & set(session_members(node.process.pid)))
    raylet = victim.raylet_pid()
    assert raylet is not None, victim.log.read_text()[-2000:]
    kills = [inject(api, job_id, "worker", 1, lambda: os.kill(raylet, signal.SIGKILL))]

    rec = assert_recovered(
        svc, api, job_id, reference, kills, watcher.stop(), attempts=range(1, 2), resume_must_be_listed=False
    )
    assert ("RESTARTING", "worker_died", 1) in events_of(api, job_id)
    assert len(rec.resumes[1]) == 1, rec.resumes
    assert len(svc.alive_nodes()) == 2  # it ran to the end on the two nodes left


def _worker_nodes(svc: ServiceProcess, want: int = 2) -> set[str]:
    """The Ray node ids of the live RayTrainWorker actors, once ``want`` of them are placed."""

    def placed() -> set[str] | None:
        actors = state_api(svc.dashboard_url, svc.token(), "actors", class_name="RayTrainWorker", state="ALIVE")
        nodes = [a.get("node_id") for a in actors if a.get("node_id")]
        return set(nodes) if len(nodes) == want else None

    return wait_until(placed, 120, f"{want} placed workers")


def _blame_twice(svc: ServiceProcess, node_id: str, job_id: str) -> None:
    """Two faults on ``node_id``: a bad node (what a hang and a straggler would record: tests/unit/test_bad_nodes.py)."""
    engine = create_engine(svc.env()["ORCHESTRATOR_DATABASE_URL"])
    try:
        with Session(engine) as session, session.begin():
            for kind in ("hung", "straggler"):
                session.add(NodeFault(node_id=node_id, kind=kind, job_id=job_id, attempt=1, message=kind))
    finally:
        engine.dispose()


def test_a_bad_node_is_kept_out_of_the_next_jobs_placement(three_nodes):
    """Ray's own choice for a 2-worker job first, then one of the nodes it chose made bad: the next job's workers
    are placed on the other two (DriverAssignment.avoid_nodes, a label selector on ray.io/node-id), and
    GET /v1/cluster names the node until a cluster admin clears it."""
    svc, _nodes = three_nodes
    api = svc.api()
    first = api.submit(spec("placed-anywhere", epochs=20))["id"]
    chosen = _worker_nodes(svc)
    api.http.post(f"/v1/jobs/{first}/cancel").raise_for_status()
    api.wait(first, {"CANCELLED"})
    head = next(n["node_id"] for n in svc.alive_nodes() if n.get("is_head_node"))
    bad = sorted(chosen - {head})[0]  # a node Ray chose (not the head: it runs the drivers)
    _blame_twice(svc, bad, first)
    assert [n["node_id"] for n in api.http.get("/v1/cluster").json()["bad_nodes"]] == [bad]

    second = api.submit(spec("placed-elsewhere", epochs=20))["id"]
    placed = _worker_nodes(svc)
    assert bad not in placed and len(placed) == 2, (bad, placed)
    api.http.post(f"/v1/jobs/{second}/cancel").raise_for_status()
    api.wait(second, {"CANCELLED"})
    assert api.http.delete(f"/v1/cluster/bad-nodes/{bad}").status_code == 204
    assert api.http.get("/v1/cluster").json()["bad_nodes"] == []
