"""100 submissions with one Idempotency-Key at the same moment make exactly one job (docs/jobs.md, "Endpoints"), over
real HTTP on SQLite and PostgreSQL: every answer is the first job (201 once, 200 + ``Idempotent-Replayed`` for the
rest), never a 500 from the race between the key's lookup and the insert. Once through one server, and once through two
server processes on one database (two replicas), 50 submissions to each at the same moment."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
from sqlalchemy import func, select

from orchestrator.db.engine import make_engine, make_session_factory
from orchestrator.db.models import Job
from tests.conftest import free_port
from tests.unit.api_helpers import assert_one_made_and_the_rest_replayed, auth, make_project
from tests.unit.live_server import serve

CONCURRENT_POSTS = 100
ROOT = Path(__file__).resolve().parents[2]


def test_concurrent_posts_with_one_idempotency_key_make_one_job(database_url, tmp_path, backend):
    with serve(tmp_path, backend, database_url=database_url) as live, httpx.Client(base_url=live.url) as admin:
        project_id, keys = make_project(admin, "race")
        headers = {**auth(keys["member"]), "Idempotency-Key": "nightly-2026-11-26"}
        body = {"workload": "digits", "name": "nightly"}
        start = threading.Barrier(CONCURRENT_POSTS)

        def post(_: int) -> httpx.Response:
            # One client per thread: 100 connections, so the server really handles them at once.
            with httpx.Client(base_url=live.url, timeout=60) as client:
                start.wait()
                return client.post("/v1/jobs", json=body, headers=headers)

        with ThreadPoolExecutor(CONCURRENT_POSTS) as pool:
            answers = list(pool.map(post, range(CONCURRENT_POSTS)))

        assert_one_made_and_the_rest_replayed(answers)

        with live.app.state.service.sessions() as session:
            rows = session.scalars(select(Job.id).where(Job.project_id == project_id)).all()
            assert rows == [answers[0].json()["id"]]
            assert session.scalar(select(func.count()).select_from(Job)) == 1


@contextmanager
def replica(root: Path, database_url: str) -> Iterator[str]:
    """One API server process (``tests.unit.live_server``: the unit-test app, fake cluster, no loops) on
    ``database_url``; yields its URL once it answers, kills it after."""
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCHESTRATOR_")}
    log = (root / f"replica-{port}.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.unit.live_server", str(root), str(port), database_url],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, (root / f"replica-{port}.log").read_text()[-3000:]
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, f"the replica on {url} did not answer within 60 s"
            time.sleep(0.1)
        yield url
    finally:
        process.kill()
        process.wait(30)
        log.close()


def test_concurrent_posts_through_two_replicas_make_one_job(database_url, tmp_path):
    """Two server processes on one database, 50 submissions with one key to each at the same moment. PostgreSQL is
    the two-replica setup (docs/deploy.md); on SQLite the service runs as one process (its loops are not elected),
    but two API processes on one SQLite file still make one job: the unique (project, key) constraint decides, in
    the database, whichever process inserts first."""
    with ExitStack() as stack:
        # One after the other: each migrates the database on start (PostgreSQL's upgrade holds a lock; SQLite's not).
        urls = [stack.enter_context(replica(tmp_path / name, database_url)) for name in ("a", "b")]
        with httpx.Client(base_url=urls[0]) as admin:
            project_id, keys = make_project(admin, "race-two")
        headers = {**auth(keys["member"]), "Idempotency-Key": "nightly-two-replicas"}
        body = {"workload": "digits", "name": "nightly"}
        start = threading.Barrier(CONCURRENT_POSTS)

        def post(n: int) -> httpx.Response:
            with httpx.Client(base_url=urls[n % 2], timeout=60) as client:  # 50 to each replica
                start.wait()
                return client.post("/v1/jobs", json=body, headers=headers)

        with ThreadPoolExecutor(CONCURRENT_POSTS) as pool:
            answers = list(pool.map(post, range(CONCURRENT_POSTS)))

    assert_one_made_and_the_rest_replayed(answers)

    engine = make_engine(database_url)
    try:
        with make_session_factory(engine)() as session:
            assert session.scalars(select(Job.id).where(Job.project_id == project_id)).all() == [
                answers[0].json()["id"]
            ]
            assert session.scalar(select(func.count()).select_from(Job)) == 1
    finally:
        engine.dispose()
