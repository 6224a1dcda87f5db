"""The private Ray pieces we lean on (workers.train.ray_internals) are still there, as we use them.

Each test names one piece: after a Ray upgrade, a failure here says which of our hooks Ray moved or
changed, before any job silently falls back to Ray's defaults. Importing the module is the first check
(every name exists); the tests below check the signatures and attributes the code uses.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import pathlib
import re

import ray
from ray.train.v2.api.config import FailureConfig
from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

from workers.train import ray_internals
from workers.train.run_snapshot import _VALIDATION_STATUS_LISTS, SNAPSHOT_FILE

REPO = pathlib.Path(__file__).resolve().parents[2]


def _parameters(function) -> list[str]:
    return [name for name in inspect.signature(function).parameters if name != "self"]


def test_checked_against_the_ray_version_we_pin():
    # The module's docstring and these tests describe Ray 2.60; pyproject.toml pins the same version.
    pin = re.search(r'"ray\[[^\]]*\]==([^"]+)"', (REPO / "pyproject.toml").read_text())
    assert pin is not None and ray.__version__ == pin.group(1)


def test_a_wrapped_user_exception_keeps_the_raised_error_and_its_traceback():
    error = ValueError("bad batch")
    wrapped = ray_internals.UserExceptionWithTraceback(error, "Traceback ...\nValueError: bad batch")
    assert wrapped._base_exc is error
    assert "Traceback ..." in str(wrapped)
    assert issubclass(ray_internals.UserExceptionWithTraceback, ray_internals.RayTrainError)


def test_a_failed_health_check_carries_the_ray_error_under_it():
    cause = RuntimeError("actor died")
    error = ray_internals.WorkerHealthCheckFailedError("worker failed its health check", cause)
    assert error.health_check_failure is cause
    assert issubclass(ray_internals.WorkerHealthCheckFailedError, ray_internals.RayTrainError)
    assert issubclass(ray_internals.RayTrainError, Exception)


def test_the_default_failure_policy_is_still_subclassable_as_we_do():
    assert issubclass(ray_internals.FailureDecision, enum.Enum)
    assert {"RETRY", "RAISE"} <= set(ray_internals.FailureDecision.__members__)
    assert _parameters(ray_internals.DefaultFailurePolicy.__init__) == ["failure_config"]
    assert _parameters(ray_internals.DefaultFailurePolicy.make_decision) == ["training_failed_error"]
    config = FailureConfig(max_failures=2)
    assert ray_internals.DefaultFailurePolicy(config).failure_config is config


def test_fit_still_builds_its_failure_policy_from_the_module_level_factory():
    assert callable(ray_internals.data_parallel_trainer.create_failure_policy)
    assert ray_internals.data_parallel_trainer.DataParallelTrainer is DataParallelTrainer
    assert "create_failure_policy(self.run_config.failure_config)" in inspect.getsource(DataParallelTrainer.fit)


def test_the_hook_before_a_worker_group_starts_is_still_called_before_its_placement_group():
    hook = ray_internals.WorkerGroupCallback.before_worker_group_start
    assert _parameters(hook) == ["worker_group_context"]
    start = inspect.getsource(ray_internals.WorkerGroup._start_impl)
    assert start.index("before_worker_group_start") < start.index("_create_placement_group")
    # WaitForFreedResources reads these two fields of the context it is given.
    context_fields = {f.name for f in dataclasses.fields(ray_internals.WorkerGroupContext)}
    assert {"num_workers", "resources_per_worker"} <= context_fields


def test_the_hook_after_a_worker_group_starts_still_runs_after_its_backend_and_before_training():
    """``WorkersUp`` (the start-up timeline's workers_up) is told once the workers and their process group are up."""
    hook = ray_internals.WorkerGroupCallback.after_worker_group_start
    assert _parameters(hook) == ["worker_group"]
    start = inspect.getsource(ray_internals.WorkerGroup._start_impl)
    assert start.index("after_worker_group_start") < start.index("run_train_fn")
    # The user's (our) callbacks come after Ray Train's own, BackendSetupCallback (the process group) among them.
    default = inspect.getsource(DataParallelTrainer._create_default_callbacks)
    assert default.index("BackendSetupCallback(") < default.index("run_config_callbacks")


def test_the_datasets_callback_is_still_added_by_the_default_callbacks():
    assert inspect.isclass(ray_internals.DatasetsCallback)
    assert _parameters(DataParallelTrainer._create_default_callbacks) == []
    assert "DatasetsCallback(" in inspect.getsource(DataParallelTrainer._create_default_callbacks)


def test_the_run_snapshot_is_still_the_file_and_fields_run_snapshot_edits():
    assert ray_internals.CHECKPOINT_MANAGER_SNAPSHOT_FILENAME == SNAPSHOT_FILE
    fields = set(ray_internals.CheckpointManagerState.model_fields)
    assert {
        "checkpoint_results",
        "checkpoint_report_indices",
        "latest_checkpoint_result",
        "pending_training_results",
        "pending_validation_specs",
        *_VALIDATION_STATUS_LISTS,
    } <= fields
    assert "checkpoint_dir_name" in ray_internals.TrainingResultState.model_fields
    assert {"storage_path", "experiment_dir_name"} <= set(_parameters(ray_internals.StorageContext.__init__))
    assert {"checkpoint_config", "storage_context"} <= set(_parameters(ray_internals.CheckpointManager.__init__))
    assert issubclass(ray_internals.CheckpointManagerInitializationError, ray_internals.RayTrainError)


def test_nothing_else_imports_a_private_ray_module():
    # One place to look when Ray changes: the code and the unit tests import them through ray_internals.
    private = re.compile(r"^\s*(from|import)\s+ray(\.\w+)*\._\w+", re.MULTILINE)
    offenders = [
        str(path.relative_to(REPO))
        for folder in ("api", "orchestrator", "workers", "tests/unit", "tests/security")
        for path in (REPO / folder).rglob("*.py")
        if path.name != "ray_internals.py" and private.search(path.read_text())
    ]
    assert offenders == []
