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
# Ray fails every new task and object once its temp disk is 95 % full. The test machines share a disk whose
# free space swings by tens of GiB, and these tests write little: refuse only past 99 % (2.5 GiB of 252).
RAY_DISK_THRESHOLD = "RAY_local_fs_capacity_threshold"  # Ray's own spelling (its config names are lower case)
os.environ.setdefault(RAY_DISK_THRESHOLD, "0.99")

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


def pytest_report_header(config: pytest.Config) -> list[str]:
    """What the machine had at the start, printed at the top of every suite's output: when a CI run fails on
    a machine no one can log in to, this says whether the disk, memory or CPUs were short."""
    tmp = shutil.disk_usage(tempfile.gettempdir())
    used = 1 - tmp.free / tmp.total
    available_kib = 0
    if os.path.exists("/proc/meminfo"):
        with open("/proc/meminfo") as meminfo:
            available_kib = next((int(line.split()[1]) for line in meminfo if line.startswith("MemAvailable:")), 0)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    threshold = float(os.environ.get(RAY_DISK_THRESHOLD, "0.95"))
    warning = f"  << Ray refuses new tasks above {threshold:.0%}" if used > threshold - 0.02 else ""
    return [
        f"machine: {os.cpu_count()} CPUs, load {load}; {available_kib / 2**20:.1f} GiB memory available; "
        f"{tempfile.gettempdir()} {tmp.free / 2**30:.1f} GiB free of {tmp.total / 2**30:.0f} GiB "
        f"({used:.0%} used){warning}"
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
