"""Shared fixtures: databases (SQLite and PostgreSQL), settings, free ports; the ``gpu`` marker's skips."""

from __future__ import annotations

import functools
import os
import shutil
import socket
import tempfile
import uuid
from collections.abc import Iterator

import psycopg
import pytest

# Ray Serve's HAProxy ingress keeps a stopping replica draining for at least 30 s, so that a load balancer
# outside the cluster stops sending to it first. The tests' clusters have none, and every Serve teardown and
# every rolling update waited those 30 s (serve.shutdown() gave up at its own 30 s timeout). Every Ray node
# the tests start inherits this process's environment; a production cluster keeps Ray's default.
os.environ.setdefault("RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S", "3")

PG_ADMIN_URL = os.environ.get("ORCHESTRATOR_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


@functools.cache
def cuda_device_count() -> int:
    """The CUDA GPUs this process sees (``CUDA_VISIBLE_DEVICES`` applies); 0 without a CUDA build of torch."""
    import torch  # here: most test runs never ask, and torch takes a second to import

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def gpus_needed(item: pytest.Item) -> int:
    """``@pytest.mark.gpu`` asks for one GPU, ``@pytest.mark.gpu(2)`` for two (NCCL: one GPU per rank)."""
    marker = item.get_closest_marker("gpu")
    return int(marker.kwargs.get("count", marker.args[0] if marker.args else 1))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip, with the reason, every ``gpu`` test this machine has too few CUDA GPUs for; its CPU twin runs."""
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    available = cuda_device_count()
    for item in gpu_items:
        needed = gpus_needed(item)
        if available == 0:
            reason = "needs a CUDA GPU: torch.cuda.is_available() is false here (bash scripts/gpu-check.sh on one)"
        elif available < needed:
            reason = f"needs {needed} CUDA GPUs (NCCL runs one rank per GPU); this machine has {available}"
        else:
            continue
        item.add_marker(pytest.mark.skip(reason=reason))


def _read(path: str) -> str:
    try:
        with open(path) as file:
            return file.read().strip()
    except OSError:
        return "?"


def pytest_report_header(config: pytest.Config) -> list[str]:
    """What the machine had at the start, printed at the top of every suite's output: when a CI run fails on
    a machine no one can log in to, this says whether the disk, memory or CPUs were short (the cgroup's
    limits too: Ray's memory monitor kills workers by them)."""
    tmp = shutil.disk_usage(tempfile.gettempdir())
    meminfo = _read("/proc/meminfo").splitlines()
    available_kib = next((int(line.split()[1]) for line in meminfo if line.startswith("MemAvailable:")), 0)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return [
        f"machine: {os.cpu_count()} CPUs, load {load}; {available_kib / 2**20:.1f} GiB memory available; "
        f"{tempfile.gettempdir()} {tmp.free / 2**30:.1f} GiB free of {tmp.total / 2**30:.0f} GiB; "
        f"cgroup memory.max {_read('/sys/fs/cgroup/memory.max')}, cpu.max {_read('/sys/fs/cgroup/cpu.max')}"
    ]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def postgres_server() -> str:
    try:
        with psycopg.connect(PG_ADMIN_URL, connect_timeout=5):
            pass
    except psycopg.OperationalError as exc:
        # `make test` starts PostgreSQL first; without it this is a broken machine, not a reason to skip.
        pytest.fail(f"PostgreSQL at {PG_ADMIN_URL} is not reachable: {exc}")
    return PG_ADMIN_URL


def _fresh_pg_database(admin_url: str) -> Iterator[str]:
    name = f"orch_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = admin_url.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://")
    try:
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database_url(request, tmp_path) -> Iterator[str]:
    """A fresh, empty database per test, on each engine the service supports."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'orchestrator.db'}"
    else:
        yield from _fresh_pg_database(request.getfixturevalue("postgres_server"))
