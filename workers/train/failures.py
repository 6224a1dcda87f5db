"""Why a worker group failed, and whether restarting it can help: retry budgets by cause.

Ray Train's own failure policy restarts the worker group for every worker failure, an exception in
the training code included, so a bug is run ``max_failures`` more times and an out-of-memory is
repeated until the budget is spent. ``CauseAwareFailurePolicy`` decides by cause instead:

    worker_died  the worker process or its node went away (killed, node lost, health check failed,
                 or a collective broken because a peer did): restarted, up to ``retries.max_worker_restarts``
    app_error    an exception raised by the training code: fails at once with its traceback, unless
                 the spec sets ``retries.retry_app_errors``
    oom          out of memory (torch or Python allocation failure, Ray's memory monitor): never
                 restarted, the same step would run out again

It also tells the control plane about each restart it grants, with the cause and the count.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from ray.exceptions import OutOfMemoryError as RayOutOfMemoryError
from ray.exceptions import RayError
from ray.train.v2.api.config import FailureConfig
from ray.train.v2.api.exceptions import ControllerError, TrainingFailedError, WorkerGroupError

from workers.contract.jobs import StateEvent
from workers.runtime.reporter import EventReporter
from workers.train.ray_internals import (
    DefaultFailurePolicy,
    FailureDecision,
    RayTrainError,
    UserExceptionWithTraceback,
    WorkerHealthCheckFailedError,
    data_parallel_trainer,
)

WORKER_DIED, APP_ERROR, OOM = "worker_died", "app_error", "oom"
# Ray's memory monitor kills a worker with "...killed due to the node running low on memory".
_OOM_TEXT = re.compile(r"low on memory|out of memory|OutOfMemory|memory monitor", re.IGNORECASE)
# A rank whose peer vanished fails inside a collective, often before Ray has noticed the dead worker
# (gloo: "Read error [ip]:port: Connection reset by peer"); that is the peer dying, not a bug.
_PEER_LOST_TEXT = re.compile(
    r"gloo/transport|Connection (reset|closed) by peer|Broken pipe|NCCL (error|communicator)|ProcessGroup\w* .*(timed out|aborted)",
    re.IGNORECASE,
)
MAX_DETAIL_CHARS = 12_000


@dataclass(frozen=True)
class FailureCause:
    reason: str  # WORKER_DIED, APP_ERROR or OOM
    detail: str  # the traceback of the training code, or what Ray said about the worker
    # False when the cluster itself failed under the driver (the head or the controller unreachable):
    # the driver cannot judge the run, so it leaves the next step to the control plane.
    conclusive: bool = True

    def retryable(self, retry_app_errors: bool) -> bool:
        return self.reason == WORKER_DIED or (self.reason == APP_ERROR and retry_app_errors)


def classify_worker_failures(failures: dict[int, BaseException]) -> FailureCause:
    """One cause for a group: the worst wins (oom, then app_error), because when one rank fails the
    others usually fail after it with collateral errors (a broken collective, a reset connection)."""
    causes = {rank: _classify_one(exc) for rank, exc in failures.items()}
    for reason in (OOM, APP_ERROR, WORKER_DIED):
        ranks = sorted(rank for rank, cause in causes.items() if cause == reason)
        if ranks:
            detail = "\n".join(f"rank {rank}: {_describe(failures[rank])}" for rank in ranks)
            return FailureCause(reason, detail[-MAX_DETAIL_CHARS:])
    return FailureCause(WORKER_DIED, "the worker group failed without an error")


def classify_training_error(error: BaseException) -> FailureCause:
    """The cause of what ``TorchTrainer.fit()`` raised (or the controller's failure policy is shown)."""
    if isinstance(error, WorkerGroupError):
        # Ray's own text of a group error carries each distinct worker traceback.
        return FailureCause(classify_worker_failures(error.worker_failures).reason, str(error)[-MAX_DETAIL_CHARS:])
    if isinstance(error, ControllerError):
        return FailureCause(WORKER_DIED, f"Ray Train controller: {error.controller_failure!r}"[-MAX_DETAIL_CHARS:])
    reason = _classify_one(error)
    return FailureCause(reason, _describe(error)[-MAX_DETAIL_CHARS:], conclusive=reason != WORKER_DIED)


def _classify_one(exc: BaseException) -> str:
    # Ray Train hands over what the training code raised as it is (sometimes still wrapped in
    # UserExceptionWithTraceback); a dead worker shows up as one of Ray's own errors.
    if isinstance(exc, UserExceptionWithTraceback):
        exc = exc._base_exc
    if isinstance(exc, (RayError, RayTrainError)):  # e.g. the controller unreachable from the training code
        if isinstance(exc, WorkerHealthCheckFailedError):
            exc = exc.health_check_failure
        return OOM if isinstance(exc, RayOutOfMemoryError) or _OOM_TEXT.search(str(exc)) else WORKER_DIED
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)) or _OOM_TEXT.search(str(exc)):
        return OOM
    if isinstance(exc, torch.distributed.DistError) or _PEER_LOST_TEXT.search(str(exc)):
        return WORKER_DIED
    return APP_ERROR


def _describe(exc: BaseException) -> str:
    # UserExceptionWithTraceback's str() is the worker's full traceback.
    text = str(exc)
    return text if isinstance(exc, UserExceptionWithTraceback) else f"{type(exc).__name__}: {text}"


class CauseAwareFailurePolicy(DefaultFailurePolicy):
    """Ray Train's default policy (budgets, preemptions, controller errors), but a cause that a
    restart cannot fix is raised at once, and every granted restart is reported as RESTARTING."""

    def __init__(self, failure_config: FailureConfig, retry_app_errors: bool, reporter_args: tuple) -> None:
        super().__init__(failure_config)
        self.retry_app_errors = retry_app_errors
        self.reporter_args = reporter_args  # (url, job_id, attempt, token): the reporter is made in the controller
        self._reporter: EventReporter | None = None
        self.restarts = 0

    def make_decision(self, training_failed_error: TrainingFailedError) -> FailureDecision:
        cause = classify_training_error(training_failed_error)
        if isinstance(training_failed_error, WorkerGroupError) and not cause.retryable(self.retry_app_errors):
            return FailureDecision.RAISE
        decision = super().make_decision(training_failed_error)
        if decision == FailureDecision.RETRY:
            self.restarts += 1
            limit = self.failure_config.max_failures
            self._report(
                StateEvent(
                    state="restarting",
                    reason=cause.reason,
                    message=f"worker group restart {self.restarts} of {limit}, from the latest checkpoint, "
                    f"after:\n{cause.detail}",
                )
            )
        return decision

    def _report(self, event: StateEvent) -> None:
        if self._reporter is None:
            self._reporter = EventReporter(*self.reporter_args)
        self._reporter.emit(event)

    def __getstate__(self) -> dict:
        # Pickled into the controller actor; a reporter (a thread) is made there on first use.
        return {**self.__dict__, "_reporter": None}


@contextlib.contextmanager
def failure_policy(policy_factory) -> Iterator[None]:
    """Make ``TorchTrainer.fit()`` use our policy. Ray Train 2.60 builds the policy in the driver from
    ``create_failure_policy`` and ships it to the controller; there is no public option for it yet
    (see ``workers.train.ray_internals``). ``tests/unit/test_failures.py`` fails if that hook moves."""
    original = data_parallel_trainer.create_failure_policy
    data_parallel_trainer.create_failure_policy = policy_factory
    try:
        yield
    finally:
        data_parallel_trainer.create_failure_policy = original
