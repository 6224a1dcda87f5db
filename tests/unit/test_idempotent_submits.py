"""100 submissions with one Idempotency-Key at the same moment make exactly one job (issue 21), over real HTTP on
SQLite and PostgreSQL: every answer is the first job (201 once, 200 + ``Idempotent-Replayed`` for the rest),
never a 500 from the race between the key's lookup and the insert."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
from sqlalchemy import func, select

from orchestrator.db.models import Job
from tests.unit.api_helpers import auth, make_project
from tests.unit.live_server import serve

CONCURRENT_POSTS = 100


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

        statuses = sorted(answer.status_code for answer in answers)
        problems = [answer.text for answer in answers if answer.status_code not in (200, 201)]
        assert not problems, f"statuses {statuses}; first problem: {problems[0]}"
        assert statuses.count(201) == 1, statuses
        replays = [answer for answer in answers if answer.status_code == 200]
        assert all(answer.headers.get("Idempotent-Replayed") == "true" for answer in replays)
        assert len({answer.json()["id"] for answer in answers}) == 1

        with live.app.state.service.sessions() as session:
            rows = session.scalars(select(Job.id).where(Job.project_id == project_id)).all()
            assert rows == [answers[0].json()["id"]]
            assert session.scalar(select(func.count()).select_from(Job)) == 1
