"""A submission wakes the scheduler (docs/scheduling.md "Admission"): a run that fits is admitted at once, not at the
scheduler's next tick, which the start-up timeline's ``admitted`` shows. The loop's wake on its own, and the whole
app with its loops running on the fake cluster."""

from __future__ import annotations

import threading
import time

from fastapi.testclient import TestClient

from api.app import create_app
from orchestrator.loops.runner import Loop
from orchestrator.settings import Settings
from tests.fakes import FakeBackend
from tests.unit.api_helpers import ADMIN, auth, submit


def test_a_woken_loop_ticks_now_and_a_burst_of_wakes_makes_one_tick():
    ticks: list[float] = []
    ticked = threading.Event()

    def tick() -> None:
        ticks.append(time.monotonic())
        ticked.set()

    loop = Loop("scheduler", tick, interval_s=60)
    loop.start()
    try:
        assert ticked.wait(5)  # its first tick, at once
        ticked.clear()
        woken = time.monotonic()
        for _ in range(20):
            loop.wake()
        assert ticked.wait(5) and ticks[-1] - woken < 2  # not 60 s later
        time.sleep(0.5)
        assert len(ticks) == 2  # twenty wakes, one tick
    finally:
        loop.stop()


def test_a_submitted_job_is_admitted_before_the_schedulers_next_tick(tmp_path):
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'orchestrator.db'}",
        storage=str(tmp_path / "storage"),
        var_dir=str(tmp_path / "var"),
        admin_token=ADMIN,
        scheduler_interval_s=120,  # its next tick would be two minutes away
    )
    app = create_app(settings, backend=FakeBackend(), run_loops=True)
    with TestClient(app) as client:
        time.sleep(0.3)  # the scheduler's first tick is done: nothing was queued
        job_id = submit(client, ADMIN).json()["id"]
        deadline = time.monotonic() + 10
        while (job := client.get(f"/v1/jobs/{job_id}", headers=auth(ADMIN)).json())["state"] == "QUEUED":
            assert time.monotonic() < deadline, job
            time.sleep(0.05)
        (startup,) = job["startup"]
        admitted = next(s["at"] for s in startup["stages"] if s["stage"] == "admitted")
        assert job["state"] == "STARTING" and admitted >= job["created_at"], job
