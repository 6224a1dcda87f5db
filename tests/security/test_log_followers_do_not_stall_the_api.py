"""Hole 5: a viewer could stall the whole API with log followers: each ``?follow=true`` held a thread of
the shared pool (also the one the drivers' report routes use) for up to 24 h. Now a follow waits without a
thread, reads a job's output once per poll for all its followers, ends when the client goes away, and a key
may hold only ORCHESTRATOR_MAX_LOG_FOLLOWS_PER_KEY follows (429 past it). Over real HTTP (uvicorn), with
the fake cluster. The bounds below are liveness bounds (a stalled API never answers), not speed checks."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import httpx
import pytest
import uvicorn

from api.app import create_app
from orchestrator.settings import Settings
from tests.conftest import free_port
from tests.fakes import FakeBackend
from tests.unit.api_helpers import ADMIN, auth, make_project, run_token

FOLLOWERS = 100
ANSWER_WITHIN_S = 60  # what "stalled" means here: the old code never answered


@contextmanager
def served(database_url: str, tmp_path, **overrides) -> Iterator[tuple[str, object, FakeBackend]]:
    """The app over the fake cluster behind uvicorn on a free port: (url, app, backend)."""
    backend = FakeBackend()
    settings = Settings(
        database_url=database_url,
        storage=str(tmp_path / "storage"),
        var_dir=str(tmp_path / "var"),
        admin_token=ADMIN,
        host="127.0.0.1",
        port=free_port(),
        scheduler_interval_s=0.1,
        log_follow_poll_s=0.2,
        **overrides,
    )
    app = create_app(settings, backend=backend)
    server = uvicorn.Server(uvicorn.Config(app, host=settings.host, port=settings.port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the service did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{settings.port}", app, backend
    finally:
        server.should_exit = True
        thread.join(30)


def started_job(http: httpx.Client, backend: FakeBackend) -> tuple[str, str]:
    job = http.post("/v1/jobs", json={"workload": "digits", "epochs": 1}).json()["id"]
    deadline = time.monotonic() + 30
    while not any(sid == f"{job}-1" for sid, _, _ in backend.submitted):  # the scheduler loop admits it
        assert time.monotonic() < deadline, "the job was never submitted"
        time.sleep(0.1)
    token = run_token(http, backend, f"{job}-1")
    return job, token


class Follower:
    """One client following a job's log: opened, first chunk read, then held until closed."""

    def __init__(self, url: str, job: str, key: str):
        self.client = httpx.Client(base_url=url, headers=auth(key), timeout=ANSWER_WITHIN_S)
        self.response = self.client.send(
            self.client.build_request("GET", f"/v1/jobs/{job}/logs", params={"follow": "true"}), stream=True
        )
        self.status = self.response.status_code
        # The iterator is kept: dropped, it would close the stream (and the server would end the follow).
        self.chunks = self.response.iter_text()
        self.first = next(self.chunks) if self.status == 200 else self.response.read().decode()

    def close(self) -> None:
        self.response.close()
        self.client.close()


def test_a_hundred_followers_leave_the_api_and_the_drivers_reports_answering(database_url, tmp_path):
    with served(database_url, tmp_path, max_log_follows_per_key=FOLLOWERS) as (url, app, backend):
        http = httpx.Client(base_url=url, headers=auth(ADMIN), timeout=ANSWER_WITHIN_S)
        job, token = started_job(http, backend)
        with ThreadPoolExecutor(FOLLOWERS) as pool:
            followers = list(pool.map(lambda _: Follower(url, job, ADMIN), range(FOLLOWERS)))
        try:
            assert {(f.status, f.first) for f in followers} == {(200, f"log of {job}-1\n")}
            assert app.state.service.log_follows.active("environment-admin") == FOLLOWERS  # all held open
            reads_before = backend.asked.count("logs")
            # Every follower holds its stream; the API and the drivers' reports still answer.
            assert http.get("/v1/jobs").status_code == 200
            batch = {
                "attempt": 1,
                "events": [{"type": "metrics", "epoch": 1, "step": 1, "values": {"train_loss": 1.0}}],
            }
            assert http.post(f"/internal/v1/jobs/{job}/events", json=batch, headers=auth(token)).status_code == 200
            time.sleep(1.0)  # five polls: the job's output is read once a poll, not once a poll per follower
            assert backend.asked.count("logs") - reads_before <= 2 * 6, backend.asked.count("logs") - reads_before
        finally:
            for follower in followers:
                follower.close()
        # Clients that went away end their follows (the server cancels the streams): the slots come back.
        deadline = time.monotonic() + 30
        while app.state.service.log_follows.active("environment-admin") and time.monotonic() < deadline:
            time.sleep(0.2)
        assert app.state.service.log_follows.active("environment-admin") == 0


def test_follows_per_key_are_capped_with_a_429(database_url, tmp_path):
    with served(database_url, tmp_path, max_log_follows_per_key=2) as (url, app, backend):
        http = httpx.Client(base_url=url, headers=auth(ADMIN), timeout=ANSWER_WITHIN_S)
        _, _keys = make_project(http, "p")
        job, _ = started_job(http, backend)
        first, second = Follower(url, job, ADMIN), Follower(url, job, ADMIN)
        try:
            third = Follower(url, job, ADMIN)
            assert third.status == 429 and "ORCHESTRATOR_MAX_LOG_FOLLOWS_PER_KEY=2" in third.first
            assert third.response.headers["Retry-After"]
            third.close()
            assert http.get(f"/v1/jobs/{job}/logs").status_code == 200  # a plain read is no follow
        finally:
            first.close()
        # Another key has its own slots; the first key's freed slot can be used again once the server saw it go.
        deadline = time.monotonic() + 30
        while app.state.service.log_follows.active("environment-admin") > 1 and time.monotonic() < deadline:
            time.sleep(0.2)
        again = Follower(url, job, ADMIN)
        assert again.status == 200
        again.close()
        second.close()


@pytest.mark.parametrize("tail", [0, 1])
def test_tail_sends_only_the_last_lines(database_url, tmp_path, tail):
    with served(database_url, tmp_path) as (url, _app, backend):
        http = httpx.Client(base_url=url, headers=auth(ADMIN), timeout=ANSWER_WITHIN_S)
        job, _ = started_job(http, backend)
        backend.logs = lambda submission_id: "one\ntwo\nthree\n"
        assert http.get(f"/v1/jobs/{job}/logs", params={"tail": tail}).text == ("three\n" if tail else "")
        follower = httpx.Client(base_url=url, headers=auth(ADMIN), timeout=ANSWER_WITHIN_S)
        with follower.stream("GET", f"/v1/jobs/{job}/logs", params={"follow": "true", "tail": 2}) as response:
            assert next(response.iter_text()) == "two\nthree\n"
