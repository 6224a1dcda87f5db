"""The local Ray head dies (its whole process group, kill -9) under a running job: the service brings up
a new head on the same ports by itself, and the job goes on as a new attempt from its checkpoint."""

from __future__ import annotations

import os
import signal
import socket

import httpx
import pytest

from tests.chaos.harness import alive, wait_until
from tests.chaos.recovery import CHECKPOINT_INTERVAL, CheckpointWatcher, assert_recovered, events_of, inject, spec

pytestmark = pytest.mark.chaos


def test_head_restart_resumes_the_job_as_a_new_attempt(own_service, reference):
    service, api = own_service, own_service.api()
    job_id = api.submit(spec("head-restart"))["id"]
    watcher = CheckpointWatcher(api, job_id)
    api.wait_for_step(job_id, 10 * CHECKPOINT_INTERVAL + 5)
    old_head = service.head_pid()
    # Everything of the cluster, as `ray stop --force` would: Ray starts the job's driver and the
    # training workers outside the head's process group, and they would otherwise train on, orphaned.
    others = [*service.train_worker_pids(), service.driver_pid(f"{job_id}-1")]

    def kill_the_cluster() -> None:
        os.killpg(old_head, signal.SIGKILL)
        for pid in others:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)

    kills = [inject(api, job_id, "head", 1, kill_the_cluster)]

    def new_head() -> int | None:
        pid = service.head_pid()
        if pid is None or pid == old_head or not alive(pid):
            return None
        try:
            return pid if service.alive_nodes() else None
        except (httpx.HTTPError, OSError):
            return None

    head = wait_until(new_head, 90, "the service to start a new Ray head", interval_s=0.5)
    service.head_pids.add(head)
    assert not alive(old_head)
    nodes = service.alive_nodes()  # on the same dashboard port, so the same address for everyone
    assert len(nodes) == 1 and nodes[0]["is_head_node"], nodes
    with socket.create_connection(("127.0.0.1", service.gcs_port), timeout=5):  # and the same GCS port
        pass

    rec = assert_recovered(
        service, api, job_id, reference, kills, watcher.stop(), attempts=range(2, 4), resume_must_be_listed=False
    )
    history = events_of(api, job_id)
    assert ("RESTARTING", "driver_lost", 1) in history or ("RESTARTING", "driver_failed", 1) in history, history
    assert rec.resumed_from[0].step > 0
