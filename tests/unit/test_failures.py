"""Retry budgets by cause: which worker failures restart the group, and what is reported."""

from __future__ import annotations

import pickle

import pytest
import torch
from ray.exceptions import ActorDiedError
from ray.train.v2.api.config import FailureConfig
from ray.train.v2.api.exceptions import WorkerGroupError

from workers.train.failures import (
    APP_ERROR,
    OOM,
    WORKER_DIED,
    CauseAwareFailurePolicy,
    classify_training_error,
    classify_worker_failures,
    failure_policy,
)
from workers.train.ray_internals import (
    FailureDecision,
    UserExceptionWithTraceback,
    WorkerHealthCheckFailedError,
    data_parallel_trainer,
)


def user_error(exc: BaseException) -> UserExceptionWithTraceback:
    return UserExceptionWithTraceback(exc, f"Traceback (most recent call last):\n  ...\n{type(exc).__name__}: {exc}")


def died() -> WorkerHealthCheckFailedError:
    return WorkerHealthCheckFailedError("worker failed its health check", ActorDiedError())


def group_error(**failures_by_rank) -> WorkerGroupError:
    failures = {int(rank[1:]): exc for rank, exc in failures_by_rank.items()}
    return WorkerGroupError("\n".join(f"[Rank {r} Error Snippet]:\n{exc}" for r, exc in failures.items()), failures)


def test_a_dead_worker_is_infrastructure():
    cause = classify_worker_failures({1: died()})
    assert cause.reason == WORKER_DIED and "rank 1" in cause.detail
    assert cause.retryable(retry_app_errors=False)


@pytest.mark.parametrize("wrapped", [True, False], ids=["with-traceback", "as-raised"])
def test_an_exception_in_the_training_code_is_an_app_error(wrapped):
    # Ray Train's poll status unwraps UserExceptionWithTraceback; other paths may not.
    error = ValueError("bad batch")
    cause = classify_worker_failures({0: user_error(error) if wrapped else error})
    assert cause.reason == APP_ERROR and "ValueError: bad batch" in cause.detail
    assert not cause.retryable(retry_app_errors=False)
    assert cause.retryable(retry_app_errors=True)


@pytest.mark.parametrize(
    "error",
    [
        user_error(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")),
        torch.OutOfMemoryError("CUDA out of memory"),
        user_error(MemoryError()),
        WorkerHealthCheckFailedError("health check", ActorDiedError()),
    ],
    ids=["torch", "torch-as-raised", "python", "ray-memory-monitor"],
)
def test_out_of_memory_is_never_retried(error, monkeypatch):
    if isinstance(error, WorkerHealthCheckFailedError):  # what Ray says of an actor its memory monitor killed
        monkeypatch.setattr(
            error.health_check_failure, "error_msg", "Task was killed due to the node running low on memory."
        )
    cause = classify_worker_failures({0: error})
    assert cause.reason == OOM
    assert not cause.retryable(retry_app_errors=True)


@pytest.mark.parametrize(
    "error",
    [
        RuntimeError(
            "[../third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:6300: "
            "Connection reset by peer. This is typically caused by a remote worker hanging"
        ),
        torch.distributed.DistBackendError("NCCL communicator was aborted on rank 1"),
    ],
    ids=["gloo", "nccl"],
)
def test_a_collective_broken_by_a_lost_peer_is_infrastructure(error):
    # Measured: after a node's raylet was killed, the surviving rank reported this before Ray had
    # noticed the dead one, and it was the only error in the group.
    assert classify_worker_failures({1: error}).reason == WORKER_DIED


def test_the_root_cause_wins_over_the_collateral_failures_of_other_ranks():
    # Rank 0 raises; rank 1 then dies in a broken collective: the job failed because of rank 0's code.
    cause = classify_worker_failures({0: KeyError("label"), 1: died()})
    assert cause.reason == APP_ERROR and cause.detail.startswith("rank 0")
    assert classify_worker_failures({0: user_error(KeyError("x")), 1: user_error(MemoryError())}).reason == OOM


class Recorder:
    def __init__(self):
        self.events = []

    def emit(self, event):
        self.events.append(event)


def policy(max_failures: int, retry_app_errors: bool = False) -> tuple[CauseAwareFailurePolicy, Recorder]:
    p = CauseAwareFailurePolicy(FailureConfig(max_failures=max_failures), retry_app_errors, (None, "job", 1, "t"))
    recorder = Recorder()
    p._reporter = recorder
    return p, recorder


def test_worker_deaths_are_restarted_up_to_the_budget_and_each_restart_is_reported():
    p, recorder = policy(max_failures=2)
    decisions = [p.make_decision(group_error(r1=died())) for _ in range(3)]
    assert decisions == [FailureDecision.RETRY, FailureDecision.RETRY, FailureDecision.RAISE]
    assert [(e.state, e.reason) for e in recorder.events] == [("restarting", "worker_died")] * 2
    assert "restart 2 of 2" in recorder.events[1].message


def test_an_app_error_fails_at_once_unless_the_spec_asks_for_retries():
    p, recorder = policy(max_failures=5)
    assert p.make_decision(group_error(r0=user_error(ValueError("nan loss")))) == FailureDecision.RAISE
    assert recorder.events == []  # no RESTARTING: the driver reports FAILED with the traceback

    p, recorder = policy(max_failures=1, retry_app_errors=True)
    assert p.make_decision(group_error(r0=user_error(ValueError("flaky")))) == FailureDecision.RETRY
    assert recorder.events[0].reason == APP_ERROR and "flaky" in recorder.events[0].message
    assert p.make_decision(group_error(r0=user_error(ValueError("flaky")))) == FailureDecision.RAISE


def test_out_of_memory_fails_at_once_even_with_app_error_retries():
    p, recorder = policy(max_failures=5, retry_app_errors=True)
    assert p.make_decision(group_error(r0=user_error(torch.OutOfMemoryError("out of memory")))) == FailureDecision.RAISE
    assert recorder.events == []


def test_the_failure_reason_of_fit_keeps_rays_text_with_the_worker_tracebacks():
    error = WorkerGroupError(
        "[Rank 0 Error Snippet]:\nTraceback ...\nValueError: nan loss", {0: ValueError("nan loss")}
    )
    cause = classify_training_error(error)
    assert cause.reason == APP_ERROR and "Traceback" in cause.detail and "nan loss" in cause.detail


def test_the_cluster_failing_under_the_driver_is_left_to_the_control_plane():
    from ray.exceptions import ActorUnavailableError

    cause = classify_training_error(ActorUnavailableError("the controller's node is gone", None))
    assert cause.reason == WORKER_DIED and not cause.conclusive
    assert classify_training_error(group_error(r0=died())).conclusive  # the group's own failure is judged
    # Ray's errors raised inside the training code (calling the controller) are Ray's, not a bug.
    assert classify_worker_failures({0: user_error(ActorUnavailableError("gone", None))}).reason == WORKER_DIED


def test_the_policy_travels_to_the_controller_without_its_reporter_thread():
    p = CauseAwareFailurePolicy(FailureConfig(max_failures=1), False, ("http://cp", "job", 1, "t"))
    p._reporter = Recorder()
    copy = pickle.loads(pickle.dumps(p))
    assert copy._reporter is None and copy.reporter_args == ("http://cp", "job", 1, "t")


def test_ray_train_still_builds_its_failure_policy_where_we_hook_in():
    # Ray 2.60 has no public option for a failure policy: fit() calls this module-level factory. If an
    # upgrade moves it, this fails instead of jobs silently falling back to Ray's retry-everything policy.
    original = data_parallel_trainer.create_failure_policy
    with failure_policy(lambda config: ("ours", config)):
        assert data_parallel_trainer.create_failure_policy(1) == ("ours", 1)
    assert data_parallel_trainer.create_failure_policy is original
    assert "create_failure_policy(self.run_config.failure_config)" in _fit_source()


def _fit_source() -> str:
    import inspect

    return inspect.getsource(data_parallel_trainer.DataParallelTrainer.fit)
