"""The local cluster manager believes the pid in its pid file only while that process is still the Ray head it
started: a pid the system gave to another process is never adopted and never signalled. No Ray here:
plain processes play the head."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.backend import local_cluster
from orchestrator.backend.local_cluster import (
    LocalRayCluster,
    is_ray_head_command,
    process_command,
    process_start_time,
)
from tests.conftest import free_port

GCS_PORT = 6390
POPEN = subprocess.Popen  # the real one: a test replaces it in the module under test


@pytest.fixture
def cluster(tmp_path) -> LocalRayCluster:
    # Nothing listens on the dashboard's port: a head that is not ours cannot answer either.
    made = LocalRayCluster(
        tmp_path, gcs_port=GCS_PORT, dashboard_port=free_port(), client_port=free_port(), serve_haproxy=False
    )
    made.dir.mkdir(parents=True)
    return made


@pytest.fixture
def spawn() -> Iterator:
    started: list[subprocess.Popen] = []

    def start(*command: str) -> subprocess.Popen:
        started.append(POPEN(list(command)))
        # Until the child has exec'd, /proc shows an empty or the parent's command line.
        deadline = time.monotonic() + 10
        while process_command(started[-1].pid) != list(command) and time.monotonic() < deadline:
            time.sleep(0.01)
        return started[-1]

    yield start
    for process in started:
        process.kill()
        process.wait()


def test_a_reused_pid_is_neither_adopted_nor_signalled(cluster, spawn):
    """The pid file names a live process that is not our head (an older version's pid file: no start time)."""
    stranger = spawn("sleep", "60")
    cluster.pid_path.write_text(str(stranger.pid))

    assert cluster._recorded_pid() is None
    assert cluster.is_gone()  # the manager starts a new head instead of trusting the stranger
    cluster.stop(timeout_s=1)
    assert stranger.poll() is None  # not signalled


def test_a_pid_whose_start_time_differs_is_not_the_head_we_started(cluster, spawn):
    stranger = spawn("sleep", "60")
    cluster.pid_path.write_text(str(stranger.pid))
    cluster.started_path.write_text("1")  # the head we started ran at another time

    assert cluster._recorded_pid() is None
    assert cluster.is_gone()
    cluster.stop(timeout_s=1)
    assert stranger.poll() is None


def test_the_head_we_started_is_adopted_and_stopped(cluster, spawn):
    head = spawn("sleep", "60")
    cluster.pid_path.write_text(str(head.pid))
    cluster.started_path.write_text(process_start_time(head.pid))

    assert cluster._recorded_pid() == head.pid
    assert not cluster.is_gone()
    cluster.stop(timeout_s=10)
    assert head.wait(5) == -15  # SIGTERM, not the process group's SIGKILL
    assert not cluster.pid_path.exists() and not cluster.started_path.exists()


def test_an_old_pid_file_is_believed_for_a_ray_head_on_our_port(cluster, spawn):
    """Without a recorded start time, the command line decides: ``ray start --head ... --port <ours>``."""
    fake_ray = cluster.dir / "ray"
    fake_ray.write_text("import time\ntime.sleep(60)\n")
    head = spawn(sys.executable, str(fake_ray), "start", "--head", "--block", "--port", str(GCS_PORT))
    cluster.pid_path.write_text(str(head.pid))
    assert cluster._recorded_pid() == head.pid

    other_port = spawn(sys.executable, str(fake_ray), "start", "--head", "--port", str(GCS_PORT + 1))
    cluster.pid_path.write_text(str(other_port.pid))
    assert cluster._recorded_pid() is None


def test_start_records_the_heads_start_time(cluster, monkeypatch, spawn):
    """``start`` writes the pid and the start time of the process it launched; a later manager adopts it."""
    launched: list[subprocess.Popen] = []

    def popen(command, **kwargs):
        assert command[1:3] == ["start", "--head"]
        launched.append(spawn("sleep", "60"))
        return launched[-1]

    monkeypatch.setattr(local_cluster.subprocess, "Popen", popen)
    monkeypatch.setattr(LocalRayCluster, "_answers", lambda self: bool(launched))
    cluster.start(timeout_s=5)
    (head,) = launched
    assert cluster.pid_path.read_text() == str(head.pid)  # still the pid alone: scripts read it as an int
    assert cluster.started_path.read_text() == process_start_time(head.pid)

    later = LocalRayCluster(
        Path(cluster.dir.parent),
        gcs_port=GCS_PORT,
        dashboard_port=cluster.dashboard_port,
        client_port=1,
        serve_haproxy=False,
    )
    later.start(timeout_s=5)  # adopts: launches nothing
    assert len(launched) == 1
    assert later._recorded_pid() == head.pid


def test_process_identity_helpers(spawn):
    process = spawn("sleep", "60")
    assert process_start_time(process.pid)
    assert process_command(process.pid) == ["sleep", "60"]
    process.kill()
    process.wait()
    assert process_start_time(process.pid) is None
    assert process_command(process.pid) == []


@pytest.mark.parametrize(
    ("command", "ours"),
    [
        (["/venv/bin/python", "/venv/bin/ray", "start", "--head", "--block", "--port", "6390"], True),
        (["/venv/bin/ray", "start", "--head", "--port", "6390", "--num-cpus", "2"], True),
        (["/venv/bin/ray", "start", "--head", "--port", "6391"], False),
        (["/venv/bin/ray", "stop"], False),
        (["sleep", "60"], False),
        ([], False),
    ],
)
def test_is_ray_head_command(command, ours):
    assert is_ray_head_command(command, GCS_PORT) is ours
