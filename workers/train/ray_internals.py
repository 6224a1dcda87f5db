"""Every private piece of Ray this project leans on, imported in one place (checked against Ray 2.60).

Ray Train 2.60 has no public option for a failure policy, for a hook that runs before a worker group
starts, or for leaving out its Ray Data callback, so those come from its internals
(``ray.train.v2._internal``) and from private hooks of its public trainer. Nothing else in ``workers/``,
``orchestrator/``, ``api/`` or ``tests/unit/`` imports a private Ray module: they import it from here.
``tests/unit/test_ray_internals.py`` checks that every name below still exists with the signature and
attributes we use, so a Ray upgrade that moves or changes one fails there, by name, instead of jobs
silently falling back to Ray's defaults.

What is used, where, and why:

- ``UserExceptionWithTraceback`` (``_base_exc``; its ``str()`` is the worker's traceback): how Ray Train
  wraps what the training code raised. ``workers.train.failures`` unwraps it to classify the cause.
- ``RayTrainError``: the base of Ray Train's own errors. ``workers.train.failures`` counts them as
  infrastructure (a worker died, the controller is unreachable), never as a bug in the training code.
- ``WorkerHealthCheckFailedError`` (``health_check_failure``): a worker that failed its health check.
  ``workers.train.failures`` reads the Ray error under it to tell out-of-memory from other deaths.
- ``FailureDecision`` (``RETRY``, ``RAISE``) and ``DefaultFailurePolicy`` (``__init__(failure_config)``,
  ``make_decision(training_failed_error)``, ``failure_config``): ``workers.train.failures.CauseAwareFailurePolicy``
  subclasses Ray's default policy (its budgets) and decides by cause first.
- ``data_parallel_trainer`` (the module of the public ``DataParallelTrainer``): its module-level
  ``create_failure_policy``, which ``DataParallelTrainer.fit`` calls, is the only way to give ``fit()`` a
  policy; ``workers.train.failures.failure_policy`` swaps it for the duration of a ``fit()``.
- ``WorkerGroupCallback`` (``before_worker_group_start(worker_group_context)``, the context a
  ``WorkerGroupContext`` with ``num_workers`` and ``resources_per_worker``) and ``WorkerGroup`` (its ``_start_impl`` calls that hook
  before it creates the placement group): ``workers.train.group_start.WaitForFreedResources`` waits there
  until a failed group's resources show free, so a restart's placement group is placed on the first try.
  Its ``after_worker_group_start(worker_group)``, which ``_start_impl`` calls after Ray Train's own callbacks
  (``BackendSetupCallback``: the process group) and before the training function starts:
  ``workers.train.group_start.WorkersUp`` tells the start-up timeline's ``workers_up`` there.
- ``DatasetsCallback`` and ``DataParallelTrainer._create_default_callbacks`` (private method):
  ``workers.train.trainer`` overrides the method and ``workers.train.group_start.without_unused_datasets_callback``
  drops the callback (and the idle Ray Data actor it starts) from runs without Ray Datasets.
- Ray Train's run snapshot (``CHECKPOINT_MANAGER_SNAPSHOT_FILENAME``, the fields of
  ``CheckpointManagerState``): ``workers.train.run_snapshot`` edits that JSON file (by its format, without
  importing Ray) to forget checkpoints retention deleted. ``CheckpointManager``, ``TrainingResultState``,
  ``StorageContext`` and ``CheckpointManagerInitializationError`` are used only by
  ``tests/unit/test_checkpoint_manifest.py`` to prove that Ray loads what we write.
"""

from __future__ import annotations

from ray.train.v2._internal.callbacks.datasets import DatasetsCallback
from ray.train.v2._internal.constants import CHECKPOINT_MANAGER_SNAPSHOT_FILENAME
from ray.train.v2._internal.exceptions import (
    CheckpointManagerInitializationError,
    RayTrainError,
    UserExceptionWithTraceback,
    WorkerHealthCheckFailedError,
)
from ray.train.v2._internal.execution.callback import WorkerGroupCallback
from ray.train.v2._internal.execution.checkpoint.checkpoint_manager import (
    CheckpointManager,
)
from ray.train.v2._internal.execution.checkpoint.checkpoint_manager import (
    _CheckpointManagerState as CheckpointManagerState,
)
from ray.train.v2._internal.execution.checkpoint.checkpoint_manager import (
    _TrainingResultState as TrainingResultState,
)
from ray.train.v2._internal.execution.failure_handling import FailureDecision
from ray.train.v2._internal.execution.failure_handling.default import DefaultFailurePolicy
from ray.train.v2._internal.execution.storage import StorageContext
from ray.train.v2._internal.execution.worker_group.state import WorkerGroupContext
from ray.train.v2._internal.execution.worker_group.worker_group import WorkerGroup
from ray.train.v2.api import data_parallel_trainer

__all__ = [
    "CHECKPOINT_MANAGER_SNAPSHOT_FILENAME",
    "CheckpointManager",
    "CheckpointManagerInitializationError",
    "CheckpointManagerState",
    "DatasetsCallback",
    "DefaultFailurePolicy",
    "FailureDecision",
    "RayTrainError",
    "StorageContext",
    "TrainingResultState",
    "UserExceptionWithTraceback",
    "WorkerGroup",
    "WorkerGroupCallback",
    "WorkerGroupContext",
    "WorkerHealthCheckFailedError",
    "data_parallel_trainer",
]
