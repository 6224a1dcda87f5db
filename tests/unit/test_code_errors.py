"""An error in the job's own code is a code_error (docs/code.md, "When your code fails"): told from a bug of ours by the
traceback's frames, on real modules imported from a folder as Ray's working_dir would hold them."""

from __future__ import annotations

import pickle
import sys

import pytest
import torch
from ray.exceptions import RayTaskError
from ray.train.v2.api.config import FailureConfig
from ray.train.v2.api.exceptions import WorkerGroupError

from orchestrator_contract.jobs import JobSpec
from workers.train.attempt import failure_summary
from workers.train.code_errors import LOADING, RAISED, blame_user_code, code_error_of
from workers.train.failures import (
    APP_ERROR,
    CODE_ERROR,
    OOM,
    CauseAwareFailurePolicy,
    classify_training_error,
    classify_trial_error,
    classify_worker_failures,
)
from workers.train.ray_internals import FailureDecision, UserExceptionWithTraceback

GOOD = """
def helper(config):
    raise KeyError("no such column: " + config["column"])


def build(config, seed):
    return helper(config)
"""


@pytest.fixture
def package(tmp_path, monkeypatch):
    """A folder like an uploaded package in Ray's working_dir: the current directory and on sys.path."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    names = set()

    def write(module: str, text: str) -> str:
        (tmp_path / f"{module}.py").write_text(text)
        names.add(module)
        return str(tmp_path / f"{module}.py")

    yield write
    for name in names:
        sys.modules.pop(name, None)


def config(workload: str, code: bool = True) -> dict:
    spec = {"workload": workload}
    if code:
        spec["code"] = {"id": "sha256:" + "0" * 64}
    return {"spec": spec}


def run(train_fn, cfg: dict) -> BaseException:
    with pytest.raises(BaseException) as raised:
        blame_user_code(train_fn)(cfg)
    # As Ray Train hands it to the controller and the driver: pickled, wrapped with the worker's traceback.
    return pickle.loads(pickle.dumps(UserExceptionWithTraceback(raised.value, "Traceback ...")))


def build_and_train(cfg: dict) -> None:
    """Our loop's part: it calls the workload's build."""
    from workers.workloads import load_workload

    load_workload(cfg["spec"]["workload"])({"column": "price"}, 0)


def test_an_exception_raised_inside_the_users_code_is_a_code_error_naming_its_file_and_line(package):
    path = package("train_cols", GOOD)
    error = run(build_and_train, config("train_cols:build"))
    kind, where = code_error_of(error._base_exc)
    # The innermost frame of the user's code, its path from the package's folder.
    assert kind == RAISED and where == "train_cols.py, line 3, in helper" and path.endswith("/train_cols.py")
    cause = classify_worker_failures({0: error})
    assert (cause.reason, cause.permanent, cause.where) == (CODE_ERROR, False, where)
    assert not cause.retryable(retry_app_errors=False) and cause.retryable(retry_app_errors=True)


@pytest.mark.parametrize(
    ("workload", "text", "says", "where"),
    [
        ("train_cols:fit", GOOD, "'train_cols' has no function 'fit'", ""),
        ("not_there:build", None, "module 'not_there' is not installed", ""),
        (
            "train_cols:build",
            "import no_such_dependency\n" + GOOD,
            "No module named 'no_such_dependency'",
            "train_cols.py, line 1, in <module>",
        ),
        ("train_cols:build", "def build(config, seed)\n    pass\n", "expected ':'", "train_cols.py, line 1"),
    ],
    ids=["function-missing", "module-missing", "import-missing", "syntax-error"],
)
def test_code_that_cannot_load_is_a_code_error_never_retried(package, workload, text, says, where):
    if text is not None:
        package("train_cols", text)
    error = run(build_and_train, config(workload))
    assert code_error_of(error._base_exc) == (LOADING, where)  # the line in the user's code, when there is one
    assert says in str(error._base_exc)
    cause = classify_worker_failures({0: error})
    assert (cause.reason, cause.permanent) == (CODE_ERROR, True)
    assert not cause.retryable(retry_app_errors=True)
    summary = failure_summary(cause, JobSpec.model_validate({"workload": workload}))
    assert summary.startswith(f"the workload {workload!r} could not be loaded from your code")


@pytest.mark.parametrize(
    ("entrypoint", "text", "says"),
    [
        ("train_fn:main", "def other(ctx):\n    pass\n", "'train_fn' has no function 'main'"),
        ("train_fn:main", "def main(ctx)\n    pass\n", "expected ':'"),
    ],
    ids=["function-missing", "syntax-error"],
)
def test_a_training_function_that_cannot_load_is_a_code_error_naming_the_entrypoint(package, entrypoint, text, says):
    package("train_fn", text)
    spec = {"entrypoint": entrypoint, "code": {"id": "sha256:" + "0" * 64}}
    error = run(lambda cfg: pytest.fail("the function runner must not start"), {"spec": spec})
    assert code_error_of(error._base_exc)[0] == LOADING and says in str(error._base_exc)
    cause = classify_worker_failures({0: error})
    assert (cause.reason, cause.permanent) == (CODE_ERROR, True)
    summary = failure_summary(cause, JobSpec.model_validate(spec))
    assert summary.startswith(f"the entrypoint {entrypoint!r} could not be loaded from your code")


def test_an_exception_in_a_training_function_is_a_code_error_naming_its_line(package):
    package("train_fn", "def main(ctx):\n    raise RuntimeError('diverged')\n")

    def run_function(cfg):  # the function runner's part: it calls main(ctx)
        from orchestrator_contract.workloads import load_entrypoint

        load_entrypoint(cfg["spec"]["entrypoint"])(None)

    error = run(run_function, {"spec": {"entrypoint": "train_fn:main", "code": {"id": "sha256:" + "0" * 64}}})
    assert code_error_of(error._base_exc) == (RAISED, "train_fn.py, line 2, in main")


def test_an_installed_custom_workloads_package_is_the_users_code_too():
    # example_workloads (examples/, installed) is no uploaded package: its own frames decide.
    def train(cfg):
        from workers.workloads import load_workload

        workload = load_workload("example_workloads.faulty:build")({"points": 40, "fail_after_samples": 1}, 0)
        workload.train_dataset[0]
        workload.train_dataset[1]

    error = run(train, config("example_workloads.faulty:build", code=False))
    assert classify_worker_failures({0: error}).reason == CODE_ERROR
    assert "example_workloads/faulty.py" in code_error_of(error._base_exc)[1]


def test_a_bug_in_our_own_loop_stays_an_app_error(package):
    package("train_cols", GOOD)

    def our_loop(cfg):
        raise ZeroDivisionError("a bug of ours")  # no frame of the package's

    error = run(our_loop, config("train_cols:build"))
    assert code_error_of(error._base_exc) is None
    assert classify_worker_failures({0: error}).reason == APP_ERROR

    def our_import(cfg):
        import not_a_module_of_ours  # noqa: F401  (its traceback passes through "<frozen importlib...>")

    error = run(our_import, config("train_cols:build"))
    assert classify_worker_failures({0: error}).reason == APP_ERROR
    # A built-in workload's failures are ours whatever the job's code holds.
    assert classify_worker_failures({0: run(our_loop, config("digits"))}).reason == APP_ERROR


def test_out_of_memory_in_the_users_code_is_still_out_of_memory(package):
    package("train_oom", "import torch\n\ndef build(config, seed):\n    raise torch.OutOfMemoryError('CUDA oom')\n")
    error = run(build_and_train, config("train_oom:build"))
    assert code_error_of(error._base_exc)[0] == RAISED
    assert classify_worker_failures({0: error}).reason == OOM


def _group(error: BaseException) -> WorkerGroupError:
    return WorkerGroupError(f"[Rank 0 Error Snippet]:\n{error}", {0: error})


def _policy(retry_app_errors: bool) -> tuple[CauseAwareFailurePolicy, list]:
    policy = CauseAwareFailurePolicy(FailureConfig(max_failures=3), retry_app_errors, (None, "job", 1, "t"))
    events: list = []
    policy._reporter = type("Recorder", (), {"emit": lambda self, event: events.append(event)})()
    return policy, events


def test_the_policy_never_restarts_code_that_cannot_load_and_restarts_raised_code_errors_when_asked(package):
    package("train_cols", GOOD)
    policy, events = _policy(retry_app_errors=True)
    missing = run(build_and_train, config("train_cols:fit"))
    assert policy.make_decision(_group(missing)) == FailureDecision.RAISE and events == []

    raised = run(build_and_train, config("train_cols:build"))
    assert policy.make_decision(_group(raised)) == FailureDecision.RETRY
    assert (events[0].state, events[0].reason) == ("restarting", CODE_ERROR)
    policy, events = _policy(retry_app_errors=False)
    assert policy.make_decision(_group(raised)) == FailureDecision.RAISE


def test_a_failed_trial_gets_the_reason_a_job_would(package):
    package("train_cols", GOOD)
    group = _group(run(build_and_train, config("train_cols:build")))
    # Tune hands over what the trial's actor task raised: Ray's task error around fit()'s.
    wrapped = RayTaskError("run_trial", "Traceback ...", group).as_instanceof_cause()
    assert classify_trial_error(wrapped) == CODE_ERROR == classify_training_error(group).reason
    assert classify_trial_error(RuntimeError("not a Train run's failure")) == ""
    assert classify_trial_error(None) == ""
    assert classify_trial_error(_group(torch.OutOfMemoryError("oom"))) == OOM
