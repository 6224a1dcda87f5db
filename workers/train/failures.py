"""Why a worker group failed, and whether restarting it can help: retry budgets by cause.

Ray Train's own failure policy restarts the worker group for every worker failure, an exception in
the training code included, so a bug is run ``max_failures`` more times and an out-of-memory is
repeated until the budget is spent. ``CauseAwareFailurePolicy`` decides by cause instead:

    worker_died  the worker process or its node went away (killed, node lost, health check failed,
                 or a collective broken because a peer did): restarted, up to ``retries.max_worker_restarts``
    code_error   an error in the job's own code (``workers.train.code_errors`` tells it from ours by the
                 traceback's frames): its workload cannot be loaded (module or function missing, an
                 ImportError, a SyntaxError), never restarted; or it raised while training, which fails
                 at once with its traceback unless the spec sets ``retries.retry_app_errors``
    app_error    any other exception raised in the training loop (a bug of ours): as a raised code_error
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

from orchestrator_contract.jobs import StateEvent
from workers.runtime.reporter import EventReporter
from workers.train.code_errors import LOADING, code_error_of
from workers.train.ray_internals import (
    DefaultFailurePolicy,
    FailureDecision,
    RayTrainError,
    UserExceptionWithTraceback,
    WorkerHealthCheckFailedError,
    data_parallel_trainer,
)

WORKER_DIED, CODE_ERROR, APP_ERROR, OOM = "worker_died", "code_error", "app_error", "oom"
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
    reason: str  # WORKER_DIED, CODE_ERROR, APP_ERROR or OOM
    detail: str  # the traceback of the training code, or what Ray said about the worker
    # False when the cluster itself failed under the driver (the head or the controller unreachable):
    # the driver cannot judge the run, so it leaves the next step to the control plane.
    conclusive: bool = True
    # A code_error no retry can pass (the workload could not be loaded), and where in the job's code it was.
    permanent: bool = False
    where: str = ""

    def retryable(self, retry_app_errors: bool) -> bool:
        if self.reason == WORKER_DIED:
            return True
        return self.reason in (CODE_ERROR, APP_ERROR) and retry_app_errors and not self.permanent


def classify_worker_failures(failures: dict[int, BaseException]) -> FailureCause:
    """One cause for a group: the worst wins (oom, then code_error, then app_error), because when one rank
    fails the others usually fail after it with collateral errors (a broken collective, a reset connection)."""
    causes = {rank: _classify_one(exc) for rank, exc in failures.items()}
    for reason in (OOM, CODE_ERROR, APP_ERROR, WORKER_DIED):
        ranks = sorted(rank for rank, cause in causes.items() if cause == reason)
        if ranks:
            detail = "\n".join(f"rank {rank}: {_describe(failures[rank])}" for rank in ranks)
            marks = [code_error_of(_unwrapped(failures[rank])) for rank in ranks] if reason == CODE_ERROR else []
            return FailureCause(
                reason,
                detail[-MAX_DETAIL_CHARS:],
                permanent=any(mark and mark[0] == LOADING for mark in marks),
                where=next((mark[1] for mark in marks if mark), ""),
            )
    return FailureCause(WORKER_DIED, "the worker group failed without an error")


def classify_training_error(error: BaseException) -> FailureCause:
    """The cause of what ``TorchTrainer.fit()`` raised (or the controller's failure policy is shown)."""
    if isinstance(error, WorkerGroupError):
        # Ray's own text of a group error carries each distinct worker traceback.
        cause = classify_worker_failures(error.worker_failures)
        return FailureCause(cause.reason, str(error)[-MAX_DETAIL_CHARS:], permanent=cause.permanent, where=cause.where)
    if isinstance(error, ControllerError):
        return FailureCause(WORKER_DIED, f"Ray Train controller: {error.controller_failure!r}"[-MAX_DETAIL_CHARS:])
    reason = _classify_one(error)
    return FailureCause(reason, _describe(error)[-MAX_DETAIL_CHARS:], conclusive=reason != WORKER_DIED)


class TrialDeadlineExceeded(Exception):
    """A sweep trial ran past its deadline (its base's ``max_runtime_s``): checkpointed and stopped
    (``workers.tune.tuner.run_trial``); the trial ends FAILED ``deadline_exceeded``."""


DEADLINE_EXCEEDED = "deadline_exceeded"


def classify_trial_error(error: BaseException | None) -> str:
    """The reason a sweep trial failed with, the same as a job's failing the same way; "" when Tune's error
    is not a Train run's failure (an error it could not unpickle, say): the trial's default reason then."""
    while isinstance(error, RayError) and isinstance(getattr(error, "cause", None), BaseException):
        error = error.cause  # the trial's actor task failed with what fit() raised
    if isinstance(error, TrialDeadlineExceeded):
        return DEADLINE_EXCEEDED
    if not isinstance(error, TrainingFailedError):
        return ""
    cause = classify_training_error(error)
    return cause.reason if cause.conclusive else ""


def _unwrapped(exc: BaseException) -> BaseException:
    # Ray Train hands over what the training code raised as it is, or still wrapped in
    # UserExceptionWithTraceback (whose str() is the worker's traceback).
    return exc._base_exc if isinstance(exc, UserExceptionWithTraceback) else exc


def _classify_one(exc: BaseException) -> str:
    # A dead worker shows up as one of Ray's own errors.
    exc = _unwrapped(exc)
    if isinstance(exc, (RayError, RayTrainError)):  # e.g. the controller unreachable from the training code
        if isinstance(exc, WorkerHealthCheckFailedError):
            exc = exc.health_check_failure
        return OOM if isinstance(exc, RayOutOfMemoryError) or _OOM_TEXT.search(str(exc)) else WORKER_DIED
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)) or _OOM_TEXT.search(str(exc)):
        return OOM
    if isinstance(exc, torch.distributed.DistError) or _PEER_LOST_TEXT.search(str(exc)):
        return WORKER_DIED
    return CODE_ERROR if code_error_of(exc) else APP_ERROR


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
