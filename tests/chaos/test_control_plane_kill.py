"""kill -9 of the control plane while a job runs and while another waits in the queue: the next start
adopts the running Ray head and every job; nothing is lost, duplicated or submitted twice."""

from __future__ import annotations

import time

import pytest

from tests.chaos.recovery import CHECKPOINT_INTERVAL, CheckpointWatcher, assert_recovered, events_of, spec

pytestmark = pytest.mark.chaos

DOWN_S = 5  # the control plane stays down this long: the job trains on, its reporter buffers


def test_control_plane_kill_while_a_job_runs(service, reference):
    api = service.api()
    job_id = api.submit(spec("control-plane-kill-run"))["id"]
    watcher = CheckpointWatcher(api, job_id)
    reported = api.wait_for_step(job_id, 5 * CHECKPOINT_INTERVAL)
    service.kill()
    time.sleep(DOWN_S)
    service.restart_adopting_the_head()
    assert api.job(job_id)["attempt"] == 1

    rec = assert_recovered(service, api, job_id, reference, [], watcher.stop(), attempts=range(1, 2))
    # The points reported while the control plane was down arrived later: rec checked none is missing.
    assert rec.steps[1][-1] > reported
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
