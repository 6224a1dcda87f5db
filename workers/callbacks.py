"""Ray Train callbacks that run in the Train controller actor during a run."""

from __future__ import annotations

from typing import Any

import pyarrow.fs
from ray.train import Checkpoint, UserCallback
from ray.train.v2._internal.exceptions import UserExceptionWithTraceback

from workers.checkpoints import checkpoint_uri
from workers.reporter import EventReporter
from workers.spec import CheckpointEvent, StateEvent

# Keys the loop adds to every checkpointed report next to its float metrics.
POSITION_KEYS = ("epoch", "step")


class RunEventForwarder(UserCallback):
    """Tells the control plane what the Train controller sees: every checkpoint Ray Train has persisted
    and registered, and every worker failure it is about to recover from by restarting the group."""

    def __init__(self, url: str | None, job_id: str, attempt: int, token: str) -> None:
        self.url, self.job_id, self.attempt, self.token = url, job_id, attempt, token
        # Made on first use, in the controller actor: this object is pickled there, a thread can't be.
        self._reporter: EventReporter | None = None

    @property
    def reporter(self) -> EventReporter:
        if self._reporter is None:
            self._reporter = EventReporter(self.url, self.job_id, self.attempt, self.token)
        return self._reporter

    def after_report(
        self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Checkpoint | None
    ) -> None:
        if checkpoint is None:
            return
        storage_path = str(run_context.run_config.storage_path)
        self.reporter.emit(checkpoint_event(checkpoint, metrics[0] if metrics else {}, storage_path))

    def after_exception(self, run_context: Any, worker_exceptions: dict[int, Exception]) -> None:
        # If the failure budget is spent, fit() raises next and the driver reports the job failed.
        self.reporter.emit(restart_event(worker_exceptions))


def restart_event(worker_exceptions: dict[int, Exception]) -> StateEvent:
    # Ray Train wraps an exception of the training code in UserExceptionWithTraceback; anything else is
    # the worker itself failing (killed, its node gone: a failed or timed-out health check).
    user_code = any(isinstance(exc, UserExceptionWithTraceback) for exc in worker_exceptions.values())
    detail = "; ".join(f"rank {rank}: {type(exc).__name__}: {exc}"[:500] for rank, exc in sorted(worker_exceptions.items()))
    return StateEvent(
        state="restarting",
        reason="worker_error" if user_code else "worker_died",
        message=f"restarting the worker group from the latest checkpoint after {detail}",
    )


def checkpoint_event(checkpoint: Checkpoint, metrics: dict[str, Any], storage_path: str) -> CheckpointEvent:
    """What the control plane records for one committed checkpoint (rank 0's metrics)."""
    return CheckpointEvent(
        epoch=int(metrics.get("epoch", 0)),
        step=int(metrics.get("step", 0)),
        path=checkpoint_uri(checkpoint, storage_path),
        size_bytes=checkpoint_size(checkpoint),
        metrics={
            key: float(value)
            for key, value in metrics.items()
            if key not in POSITION_KEYS and isinstance(value, (int, float)) and not isinstance(value, bool)
        },
    )


def checkpoint_size(checkpoint: Checkpoint) -> int:
    """Total bytes of the checkpoint's files, on whatever filesystem holds it (local or a URI)."""
    selector = pyarrow.fs.FileSelector(checkpoint.path, recursive=True)
    infos = checkpoint.filesystem.get_file_info(selector)
    return sum(info.size for info in infos if info.type == pyarrow.fs.FileType.File)
