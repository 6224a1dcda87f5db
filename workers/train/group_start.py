"""Two cuts to how long Ray Train 2.60 takes to start a worker group, which is most of a restart after a
worker dies (``bench/recovery.py``; docs/benchmarks.md has the numbers), and the start-up timeline's ``workers_up``.

All lean on Ray Train internals (there is no public option for either), imported through
``workers.train.ray_internals``: ``tests/unit/test_group_start.py`` fails if the hooks move.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence

import ray

from orchestrator_contract.jobs import StartupEvent
from workers.runtime.reporter import EventReporter
from workers.train.ray_internals import DatasetsCallback, WorkerGroupCallback

log = logging.getLogger(__name__)

# The GCS retries a placement group it could not place on a fixed 1 s tick
# (GcsPlacementGroupManager::Tick), so waiting longer than that for resources never helps.
FREED_RESOURCES_WAIT_S = 1.0
FREED_RESOURCES_POLL_S = 0.02


class WaitForFreedResources(WorkerGroupCallback):
    """After a failure Ray Train removes the old group's placement group and asks for a new one at once.
    The GCS tries the new one before the raylet has reported the old one's resources free (about 50 ms
    later), finds them taken, and tries again only on its next 1 s tick: 0.6-1 s of a restart spent idle.
    Waiting here, in the controller, until the GCS shows the resources free makes its first try succeed
    (measured: a new placement group ready in 0.03-0.12 s instead of 0.6-0.8 s)."""

    def before_worker_group_start(self, worker_group_context) -> None:
        needed = {
            name: amount * worker_group_context.num_workers
            for name, amount in worker_group_context.resources_per_worker.items()
        }
        try:
            waited = wait_until_available(needed, ray.available_resources)
        except Exception:  # only a head start for the placement group: never a reason not to start
            log.warning("could not read the cluster's free resources; starting the worker group", exc_info=True)
            return
        if waited is None:
            log.info("starting the worker group before %s is free (waited %.1f s)", needed, FREED_RESOURCES_WAIT_S)


def wait_until_available(
    needed: Mapping[str, float],
    available: Callable[[], Mapping[str, float]],
    timeout_s: float = FREED_RESOURCES_WAIT_S,
    poll_s: float = FREED_RESOURCES_POLL_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> float | None:
    """Seconds waited until ``available()`` (the cluster's free resources, summed over nodes) covers
    ``needed``; None if it still did not after ``timeout_s`` (the caller goes on: the placement group then
    waits as it always would, e.g. for a lost node's replacement)."""
    start = clock()
    while True:
        free = available()
        if all(free.get(name, 0.0) >= amount for name, amount in needed.items()):
            return clock() - start
        if clock() - start >= timeout_s:
            return None
        sleep(poll_s)


def without_unused_datasets_callback(callbacks: Sequence, datasets: Mapping | None) -> list:
    """Ray Train adds a ``DatasetsCallback`` to every run, and it starts a ``DatasetManager`` actor (one more
    Python process that imports Ray Data, about 2 s of CPU) with every worker group, even a run that
    passes no Ray Datasets. Our loops load their own data, so it only competes with the new workers'
    start for the CPU. Dropped when the run has no datasets."""
    if datasets:
        return list(callbacks)
    return [callback for callback in callbacks if not isinstance(callback, DatasetsCallback)]


class WorkersUp(WorkerGroupCallback):
    """The start-up timeline's ``workers_up`` (docs/jobs.md "Start-up timeline"): told to the control plane from the
    controller once the worker group is up. Ray Train's own callbacks run first (the list's end is ours), so the
    workers' actors are started and their process group made by then. A restarted group is told again; the control
    plane keeps an attempt's first."""

    def __init__(self, reporter_args: tuple) -> None:
        self.reporter_args = reporter_args  # (url, job_id, attempt, token): the reporter is made in the controller
        self._reporter = None

    def after_worker_group_start(self, worker_group) -> None:
        if self._reporter is None:
            self._reporter = EventReporter(*self.reporter_args)
        self._reporter.emit(StartupEvent(stage="workers_up"))

    def __getstate__(self) -> dict:
        # Pickled into the controller actor; a reporter (a thread) is made there on first use.
        return {**self.__dict__, "_reporter": None}
