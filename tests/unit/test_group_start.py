"""Faster worker-group starts (workers.train.group_start): the wait for freed resources, and no idle Ray Data actor.
On a real cluster: tests/integration/test_failure_causes_on_ray.py (a restart's placement group placed on
the first try, no DatasetManager actor)."""

from __future__ import annotations

import inspect

import pytest
from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

from orchestrator.planner import plan_job
from orchestrator_contract.jobs import JobSpec
from workers.train.group_start import WaitForFreedResources, wait_until_available, without_unused_datasets_callback
from workers.train.ray_internals import DatasetsCallback, WorkerGroup, WorkerGroupCallback
from workers.train.trainer import build_trainer


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def freed_after(seconds: float, clock: FakeClock, free: dict, taken: dict):
    return lambda: free if clock.now >= seconds else taken


def test_resources_already_free_are_not_waited_for():
    clock = FakeClock()
    waited = wait_until_available({"CPU": 2}, lambda: {"CPU": 2.0, "memory": 1e9}, clock=clock, sleep=clock.sleep)
    assert waited == 0.0


def test_waits_until_the_freed_resources_show():
    clock = FakeClock()
    available = freed_after(0.1, clock, free={"CPU": 2.0}, taken={"CPU": 1.0})
    waited = wait_until_available({"CPU": 2}, available, poll_s=0.02, clock=clock, sleep=clock.sleep)
    assert waited == pytest.approx(0.1, abs=0.02)


def test_every_resource_must_be_free():
    clock = FakeClock()
    available = freed_after(0.5, clock, free={"CPU": 4.0, "GPU": 2.0}, taken={"CPU": 4.0, "GPU": 1.0})
    waited = wait_until_available({"CPU": 2, "GPU": 2}, available, clock=clock, sleep=clock.sleep)
    assert waited == pytest.approx(0.5, abs=0.02)


def test_gives_up_after_the_timeout_so_a_lost_node_does_not_hold_the_start():
    clock = FakeClock()
    waited = wait_until_available({"CPU": 4}, lambda: {"CPU": 2.0}, timeout_s=1.0, clock=clock, sleep=clock.sleep)
    assert waited is None and 1.0 <= clock.now < 1.1


def test_the_callback_never_stops_a_start_when_the_cluster_cannot_be_read(monkeypatch):
    def unreachable():
        raise ConnectionError("GCS unavailable")

    monkeypatch.setattr("workers.train.group_start.ray.available_resources", unreachable)

    class Context:
        num_workers = 2
        resources_per_worker = {"CPU": 1.0}

    WaitForFreedResources().before_worker_group_start(Context())  # no exception


def test_the_datasets_callback_is_dropped_only_for_runs_without_datasets():
    callbacks = [DatasetsCallback.__new__(DatasetsCallback), object()]
    assert len(without_unused_datasets_callback(callbacks, {})) == 1
    assert len(without_unused_datasets_callback(callbacks, None)) == 1
    assert without_unused_datasets_callback(callbacks, {"train": object()}) == callbacks


def test_a_job_trainer_starts_its_groups_with_the_wait_and_without_the_datasets_callback(tmp_path):
    spec = JobSpec(workload="digits", scaling={"num_workers": 2})
    trainer = build_trainer(
        job_id="job",
        attempt=1,
        spec=spec,
        plan=plan_job(spec),
        storage_path=str(tmp_path),
        control_plane_url=None,
        token="t",
    )
    callbacks = trainer._create_default_callbacks()
    kinds = {type(callback).__name__ for callback in callbacks}
    assert "DatasetsCallback" not in kinds
    assert {"BackendSetupCallback", "AcceleratorSetupCallback", "WaitForFreedResources"} <= kinds


def test_ray_train_still_has_the_hooks_we_use():
    # If an upgrade moves them, this fails instead of restarts silently getting slower again.
    assert "DatasetsCallback(" in inspect.getsource(DataParallelTrainer._create_default_callbacks)
    assert issubclass(WaitForFreedResources, WorkerGroupCallback)
    start = inspect.getsource(WorkerGroup._start_impl)
    assert start.index("before_worker_group_start") < start.index("_create_placement_group")
