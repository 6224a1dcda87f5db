"""The real service as a user runs it, in a subprocess, and the ways the chaos tests break it.

Shared by ``tests/chaos`` and ``bench/recovery.py`` (no pytest here). ``ServiceProcess`` runs
``orchestrator serve`` (what ``make run`` runs) with its own SQLite file, storage, var dir and ports,
so the service starts its own local Ray head; it can be killed (``kill -9``) and started again on the
same var dir, and ``stop`` leaves no process of its cluster behind. The Ray processes are found through
the cluster's own dashboard (State API, Jobs API) and the head's session, never by name.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.ray_state import state_api

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent  # the venv's bin: `orchestrator` is its console script
ADMIN = "chaos-admin-token"
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


def free_port() -> int:
    from tests.conftest import free_port as _free_port

    return _free_port()


def wait_until(predicate: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.2) -> Any:
    """Poll ``predicate`` until it returns something truthy (which is returned); AssertionError on timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(interval_s)


def ray_is_ready(answer: httpx.Response) -> bool:
    """/readyz answers 200 once the database does (the API serves with Ray down); ``ray`` says whether Ray does."""
    return answer.status_code == 200 and answer.json()["ray"].startswith("ok")


def alive(pid: int) -> bool:
    """Running and not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return "\nState:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


def session_members(sid: int) -> list[int]:
    """Processes whose session id is ``sid``: a `ray start --head` started in its own session, and
    everything it started that did not make a session of its own (raylet, GCS, workers)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid pgrp session ...; comm may hold spaces and parentheses.
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[3]) == sid and alive(int(entry.name)):
            members.append(int(entry.name))
    return members


class Api:
    """A thin HTTP client over the service's REST API."""

    def __init__(self, base_url: str, key: str = ADMIN):
        self.http = httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {key}"}, timeout=30)

    def submit(self, spec: dict, headers: dict | None = None) -> dict:
        response = self.http.post("/v1/jobs", json=spec, headers=headers or {})
        assert response.status_code in (200, 201), response.text
        return response.json()

    def job(self, job_id: str) -> dict:
        response = self.http.get(f"/v1/jobs/{job_id}")
        response.raise_for_status()
        return response.json()

    def jobs(self, **params) -> list[dict]:
        response = self.http.get("/v1/jobs", params={"limit": 200, **params})
        response.raise_for_status()
        return response.json()["items"]

    def metrics(self, job_id: str) -> list[dict]:
        response = self.http.get(f"/v1/jobs/{job_id}/metrics")
        response.raise_for_status()
        return response.json()

    def events(self, job_id: str) -> list[dict]:
        response = self.http.get(f"/v1/jobs/{job_id}/events")
        response.raise_for_status()
        return response.json()

    def checkpoints(self, job_id: str) -> list[dict]:
        response = self.http.get(f"/v1/jobs/{job_id}/checkpoints")
        response.raise_for_status()
        return response.json()

    def logs(self, job_id: str) -> str:
        response = self.http.get(f"/v1/jobs/{job_id}/logs")
        return response.text if response.is_success else ""

    def max_step(self, job_id: str) -> int:
        return max((point["step"] for point in self.metrics(job_id)), default=0)

    def wait(self, job_id: str, states: set[str], timeout_s: float = 300) -> dict:
        """Until the job is in one of ``states``; a job that ends elsewhere is an AssertionError at once."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                job = self.job(job_id)
            except httpx.TransportError:  # the control plane is being restarted by the test
                job = None
            if job is not None:
                if job["state"] in states:
                    return job
                if job["state"] in TERMINAL:
                    raise AssertionError(
                        f"job {job_id} ended {job['state']} ({job['reason']}): {job['message'][-3000:]}"
                    )
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job_id} not in {states} after {timeout_s:.0f} s: {job}")
            time.sleep(0.3)

    def wait_for_step(self, job_id: str, step: int, timeout_s: float = 240) -> int:
        """Until the job has reported a metric point at ``step`` or later; returns the latest step."""

        def reached() -> int:
            job = self.job(job_id)
            assert job["state"] not in TERMINAL, (
                f"job ended {job['state']} before step {step}: {job['message'][-2000:]}"
            )
            latest = self.max_step(job_id)
            return latest if latest >= step else 0

        return wait_until(reached, timeout_s, f"job {job_id} to reach step {step}", interval_s=0.1)


@dataclass
class ServiceProcess:
    """``orchestrator serve`` in a subprocess, with everything it owns under ``root``."""

    root: Path
    admin_token: str = ADMIN
    num_cpus: int = 2
    settings: dict[str, str] = field(default_factory=dict)  # more ORCHESTRATOR_* variables (bench arms)
    database_url: str | None = None  # None: a SQLite file of its own under ``root``

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.var = self.root / "var"
        self.storage = self.root / "storage"
        self.port = free_port()
        self.gcs_port, self.dashboard_port, self.client_port = free_port(), free_port(), free_port()
        self.process: subprocess.Popen | None = None
        self.starts = 0
        self.head_pids: set[int] = set()  # every head this service ran: their sessions are ours to clean
        self.driver_pids: set[int] = set()

    # --- where things are ---------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def dashboard_url(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    @property
    def gcs_address(self) -> str:
        return f"127.0.0.1:{self.gcs_port}"

    @property
    def log_path(self) -> Path:
        return self.root / f"service-{self.starts}.log"

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "ORCHESTRATOR_", "PYTEST"))}
        env.update(
            OMP_NUM_THREADS="1",
            ORCHESTRATOR_DATABASE_URL=self.database_url or f"sqlite:///{self.root / 'orchestrator.db'}",
            ORCHESTRATOR_STORAGE=str(self.storage),
            ORCHESTRATOR_VAR_DIR=str(self.var),
            ORCHESTRATOR_PORT=str(self.port),
            ORCHESTRATOR_ADMIN_TOKEN=self.admin_token,
            ORCHESTRATOR_RAY_GCS_PORT=str(self.gcs_port),
            ORCHESTRATOR_RAY_DASHBOARD_PORT=str(self.dashboard_port),
            ORCHESTRATOR_RAY_CLIENT_PORT=str(self.client_port),
            ORCHESTRATOR_RAY_NUM_CPUS=str(self.num_cpus),
            ORCHESTRATOR_SCHEDULER_INTERVAL_S="0.5",
            ORCHESTRATOR_RECONCILER_INTERVAL_S="1",
            ORCHESTRATOR_TRAIN_POLL_INTERVAL_S="0.2",
            # Orphaned checkpoint folders of an ended job go at the next sweep: make it soon.
            ORCHESTRATOR_CHECKPOINT_SWEEP_INTERVAL_S="2",
        )
        env.update(self.settings)
        return env

    def api(self) -> Api:
        return Api(self.url, self.admin_token)

    def head_pid(self) -> int | None:
        try:
            return int((self.var / "ray" / "head.pid").read_text())
        except (OSError, ValueError):
            return None

    def token(self) -> str:
        return (self.var / "ray" / "auth_token").read_text().strip()

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token()}"}

    # --- life cycle ---------------------------------------------------------------------------------

    def start(self, timeout_s: float = 180) -> None:
        """Start the service (it starts or adopts its local Ray head) and wait until /readyz says Ray answers
        (its 200 alone means the database does)."""
        assert self.process is None or self.process.poll() is not None, "the service is already running"
        self.starts += 1
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [str(BIN / "orchestrator"), "serve"],
                cwd=ROOT,
                env=self.env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

        def ready() -> bool:
            if self.process.poll() is not None:
                raise AssertionError(f"the service exited with {self.process.returncode}:\n{self.tail_log()}")
            try:
                return ray_is_ready(httpx.get(f"{self.url}/readyz", timeout=5))
            except httpx.HTTPError:
                return False

        wait_until(ready, timeout_s, "the service to answer /readyz with Ray up", interval_s=0.3)
        if (pid := self.head_pid()) is not None:
            self.head_pids.add(pid)

    def kill(self) -> None:
        """kill -9 of the control plane's process (only it: its Ray head runs in a session of its own)."""
        assert self.process is not None and self.process.poll() is None, "the service is not running"
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(30)

    def switch(self, database_url: str | None, settings: dict[str, str] | None = None) -> None:
        """Start again on another database (None: its own SQLite file) and with other settings, keeping its Ray
        head: kill -9 of the service (its head lives on), then a start that adopts the head."""
        if self.process is not None and self.process.poll() is None:
            self.kill()
        self.database_url, self.settings = database_url, dict(settings or {})
        self.start()

    def restart_adopting_the_head(self) -> None:
        """Start the service again on the same var dir; it must adopt the running head, not start another."""
        head_before, nodes_before = self.head_pid(), self.alive_nodes()
        assert head_before is not None and alive(head_before), "no running head to adopt"
        self.start()
        assert self.head_pid() == head_before and alive(head_before), (
            f"the restarted service did not adopt the head (pid {head_before} -> {self.head_pid()})"
        )
        nodes_after = self.alive_nodes()
        assert len(nodes_after) == 1 and nodes_after[0]["is_head_node"], nodes_after
        assert [n["node_id"] for n in nodes_after] == [n["node_id"] for n in nodes_before], "a second cluster"
        with socket.create_connection(("127.0.0.1", self.gcs_port), timeout=5):  # the same GCS answers
            pass

    def stop(self, timeout_s: float = 90) -> list[int]:
        """Ctrl-C the service (which stops its Ray head), then make sure no process of any head it ran,
        nor any driver seen, is left; returns the pids that had to be killed here."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(30)
        if (pid := self.head_pid()) is not None:
            self.head_pids.add(pid)
        leftovers = self.cluster_processes()
        deadline = time.monotonic() + 30
        while leftovers and time.monotonic() < deadline:
            time.sleep(0.5)
            leftovers = self.cluster_processes()
        for pid in leftovers:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return leftovers

    def cluster_processes(self) -> list[int]:
        """Every live process of the heads this service ran (their sessions) and of the drivers seen."""
        pids: set[int] = set()
        for sid in self.head_pids | self.driver_pids:
            pids.update(session_members(sid))
        pids.update(pid for pid in self.driver_pids if alive(pid))
        return sorted(pids)

    def tail_log(self, chars: int = 5000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    # --- the cluster, through its own APIs ----------------------------------------------------------

    def alive_nodes(self) -> list[dict]:
        return state_api(self.dashboard_url, self.token(), "nodes", state="ALIVE")

    def train_worker_pids(self) -> list[int]:
        """Pids of the cluster's live RayTrainWorker actors (State API)."""
        actors = state_api(self.dashboard_url, self.token(), "actors", class_name="RayTrainWorker", state="ALIVE")
        return sorted(int(a["pid"]) for a in actors if a.get("pid"))

    def ray_jobs(self):
        from ray.job_submission import JobSubmissionClient

        return JobSubmissionClient(self.dashboard_url, headers=self.headers())

    def submissions(self, run_id: str) -> list[str]:
        """Submission ids of the Ray jobs this cluster has for one of our jobs or sweeps (repeats included)."""
        return [
            j.submission_id
            for j in self.ray_jobs().list_jobs()
            if run_id in ((j.metadata or {}).get("job_id"), (j.metadata or {}).get("sweep_id"))
        ]

    def driver_pid(self, submission_id: str) -> int:
        pid = int(self.ray_jobs().get_job_info(submission_id).driver_info.pid)
        self.driver_pids.add(pid)
        return pid


def kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
