"""kill -9 of the control plane while a job runs and while another waits in the queue: the next start
adopts the running Ray head and every job; nothing is lost, duplicated or submitted twice."""

from __future__ import annotations

import time

import pytest

from tests.chaos.conftest import on_both_databases
from tests.chaos.harness import ServiceProcess, wait_until
from tests.chaos.recovery import (
    CHECKPOINT_INTERVAL,
    CheckpointWatcher,
    assert_recovered,
    events_of,
    parse_time,
    spec,
)
from workers.runtime.checkpoint_io import TRAIN_STATE_FILE, load
from workers.runtime.manifest import newest_verified_checkpoint

pytestmark = pytest.mark.chaos

DOWN_S = 5  # the control plane stays down at least this long: the job trains on, its reporter buffers


def stored_step(service: ServiceProcess, job_id: str) -> int:
    """The step of the job's newest whole checkpoint in storage, read from the files themselves: what
    the cluster did, known without asking the control plane (0 if there is none yet)."""
    folder = newest_verified_checkpoint(service.storage / job_id)
    return int(load(f"{folder}/{TRAIN_STATE_FILE}")["step"]) if folder else 0


@on_both_databases
def test_control_plane_kill_while_a_job_runs(service, reference):
    api = service.api()
    job_id = api.submit(spec("control-plane-kill-run"))["id"]
    watcher = CheckpointWatcher(api, job_id)
    reported = api.wait_for_step(job_id, 5 * CHECKPOINT_INTERVAL)
    service.kill()
    down_since = time.time()  # from here until the restart no row can be written: nobody serves the API
    time.sleep(DOWN_S)
    # The job trains on while the control plane is down: it checkpoints at least one interval past the
    # last step reported before the kill (a stalled job fails here, on the timeout, not on a timing).
    made_while_down = wait_until(
        lambda: (step := stored_step(service, job_id)) >= reported + CHECKPOINT_INTERVAL and step,
        timeout_s=180,
        what="a checkpoint written while the control plane is down",
    )
    service.restart_adopting_the_head()
    assert api.job(job_id)["attempt"] == 1

    assert_recovered(service, api, job_id, reference, [], watcher.stop(), attempts=range(1, 2))
    # The points made while the control plane was down were buffered and arrived after the restart, from
    # attempt 1: every step past the last one stored before the kill, up to the checkpoint made while down.
    points = api.metrics(job_id)
    before = [p["step"] for p in points if parse_time(p["created_at"]) <= down_since]
    after = {p["step"] for p in points if parse_time(p["created_at"]) > down_since and p["attempt"] == 1}
    assert before and max(before) < made_while_down, (reported, made_while_down, sorted(before)[-3:])
    buffered = set(range(max(before) + 1, made_while_down + 1))
    assert buffered <= after, f"made while down, never delivered by attempt 1: {sorted(buffered - after)}"
    assert not [e for e in events_of(api, job_id) if e[0] == "RESTARTING"], events_of(api, job_id)
    assert service.submissions(job_id) == [f"{job_id}-1"]


def test_control_plane_kill_while_a_job_is_queued(service, reference):
    api = service.api()
    running = api.submit(spec("control-plane-kill-first"))["id"]
    replay = {"Idempotency-Key": "chaos-queued-job"}
    queued = api.submit(spec("control-plane-kill-queued"), headers=replay)["id"]
    watchers = {job_id: CheckpointWatcher(api, job_id) for job_id in (running, queued)}
    api.wait_for_step(running, 3 * CHECKPOINT_INTERVAL)
    job = api.job(queued)
    assert job["state"] == "QUEUED" and job["reason"] == "insufficient_resources", job

    service.kill()
    time.sleep(DOWN_S)
    service.restart_adopting_the_head()
    # The client that lost its answer retries its POST: the same job, not a second one.
    again = api.http.post("/v1/jobs", json=spec("control-plane-kill-queued"), headers=replay)
    assert again.status_code == 200 and again.json()["id"] == queued, again.text

    for job_id in (running, queued):
        assert_recovered(service, api, job_id, reference, [], watchers[job_id].stop(), attempts=range(1, 2))
        assert service.submissions(job_id) == [f"{job_id}-1"]
        assert not [e for e in events_of(api, job_id) if e[0] == "RESTARTING"], events_of(api, job_id)
