"""kill -9 of a training worker, of a job's driver, and of a worker while a checkpoint is being saved."""

from __future__ import annotations

import pytest

from tests.chaos.conftest import on_both_databases
from tests.chaos.harness import kill, wait_until
from tests.chaos.own_code import OWN_DIGITS, OWN_DIGITS_WORKLOAD, upload, zip_package
from tests.chaos.recovery import (
    CHAOS_SPEC,
    CHECKPOINT_INTERVAL,
    CheckpointWatcher,
    assert_recovered,
    events_of,
    inject,
    spec,
    storage_checkpoints,
)

pytestmark = pytest.mark.chaos


def test_worker_kill_restarts_the_worker_group_and_resumes(service, reference):
    api = service.api()
    job_id = api.submit(spec("worker-kill"))["id"]
    watcher = CheckpointWatcher(api, job_id)
    api.wait_for_step(job_id, 10 * CHECKPOINT_INTERVAL + 5)
    victim = min(service.train_worker_pids())
    kills = [inject(api, job_id, "worker", 1, lambda: kill(victim))]

    api.wait(job_id, {"SUCCEEDED"})
    rec = assert_recovered(service, api, job_id, reference, kills, watcher.stop(), attempts=range(1, 2))
    history = events_of(api, job_id)
    restarting = history.index(("RESTARTING", "worker_died", 1))
    assert ("RUNNING", "training_started", 1) in history[restarting:], history
    assert len(rec.resumes[1]) == 1, rec.resumes


@on_both_databases
def test_driver_kill_starts_a_new_attempt_that_resumes(service, reference):
    api = service.api()
    job_id = api.submit(spec("driver-kill"))["id"]
    watcher = CheckpointWatcher(api, job_id)
    api.wait_for_step(job_id, 10 * CHECKPOINT_INTERVAL + 5)
    driver = service.driver_pid(f"{job_id}-1")
    kills = [inject(api, job_id, "driver", 1, lambda: kill(driver))]

    rec = assert_recovered(service, api, job_id, reference, kills, watcher.stop(), attempts=range(2, 3))
    history = events_of(api, job_id)
    assert ("RESTARTING", "driver_failed", 1) in history, history
    assert ("RUNNING", "training_started", 2) in history, history
    assert service.submissions(job_id).count(f"{job_id}-1") == 1
    assert rec.steps[2][0] == rec.resumed_from[0].step + 1, "attempt 2 did not start right after its checkpoint"


def test_worker_kill_while_a_checkpoint_is_saved(service, reference):
    _kill_while_a_checkpoint_is_saved(service, reference, spec("checkpoint-kill"))


def test_worker_kill_while_an_async_checkpoint_uploads(service, reference):
    """``checkpoint.async`` without ``wait_for_commit``: the worker dies while its checkpoint writer's thread
    reports a snapshot (Ray Train copies it to storage) and training goes on. The half-uploaded one is never registered; the run resumes from
    a committed one, at least the newest the database listed when the kill landed, and ends with the
    failure-free run's metrics. How many steps are repeated depends on how fast they are against Ray Train's
    registration (its controller's poll), not on the interval: here (fast digits steps) several intervals."""
    checkpoint = {**CHAOS_SPEC["checkpoint"], "wait_for_commit": False, "async": True}
    job_spec = spec("async-checkpoint-kill", checkpoint=checkpoint)
    job, resumed_step, listed_step = _kill_while_a_checkpoint_is_saved(service, reference, job_spec, repeat_limit=None)
    assert job["spec"]["checkpoint"]["async"] is True and job["spec"]["checkpoint"]["wait_for_commit"] is False
    assert resumed_step >= listed_step > 0, (resumed_step, listed_step)


def _kill_while_a_checkpoint_is_saved(
    service, reference, job_spec: dict, repeat_limit: int | None = CHECKPOINT_INTERVAL
) -> tuple[dict, int, int]:
    """Kill a worker the moment Ray Train creates the next ``checkpoint_*`` folder in storage, before it can have
    registered it; the job recovers (``assert_recovered``) from a committed checkpoint. Returns the job, the step
    it resumed from and the newest step the database listed as the kill landed."""
    api = service.api()
    job_id = api.submit(job_spec)["id"]
    watcher = CheckpointWatcher(api, job_id)
    api.wait_for_step(job_id, 5 * CHECKPOINT_INTERVAL + 5)
    victim = min(service.train_worker_pids())
    before = storage_checkpoints(service, job_id)

    def new_folder() -> set[str]:
        return storage_checkpoints(service, job_id) - before

    saving = wait_until(new_folder, 60, "the next checkpoint folder", interval_s=0.01)
    listed_step = max((c["step"] for c in api.checkpoints(job_id)), default=0)
    kills = [inject(api, job_id, "worker", 1, lambda: kill(victim))]

    rec = assert_recovered(
        service, api, job_id, reference, kills, watcher.stop(), attempts=range(1, 2), repeat_limit=repeat_limit
    )
    assert ("RESTARTING", "worker_died", 1) in events_of(api, job_id)
    assert rec.resumed_from[0].path, f"no resume after the kill during the save of {saving}"
    return api.job(job_id), rec.resumed_from[0].step, listed_step


def test_worker_kill_with_uploaded_code_resumes_with_its_code_still_there(service, reference):
    # The scenario's digits job, its workload from an uploaded package (no node has it installed): after the
    # kill the new worker group imports it again from the run's working_dir and resumes from its checkpoint.
    api = service.api()
    code_id = upload(api, zip_package(OWN_DIGITS))
    job_id = api.submit(spec("own-code-worker-kill", workload=OWN_DIGITS_WORKLOAD, code={"id": code_id}))["id"]
    watcher = CheckpointWatcher(api, job_id)
    api.wait_for_step(job_id, 5 * CHECKPOINT_INTERVAL + 5)
    victim = min(service.train_worker_pids())
    kills = [inject(api, job_id, "worker", 1, lambda: kill(victim))]

    rec = assert_recovered(service, api, job_id, reference, kills, watcher.stop(), attempts=range(1, 2))
    assert ("RESTARTING", "worker_died", 1) in events_of(api, job_id)
    assert rec.resumed_from[0].step > 0 and len(rec.resumes[1]) == 1, rec.resumes
