"""Ray Train callbacks that run in the Train controller actor during a run."""

from __future__ import annotations

import logging
from typing import Any

import pyarrow.fs
from ray.train import Checkpoint, UserCallback

from orchestrator_contract.jobs import CheckpointEvent
from orchestrator_contract.metrics import POSITION_KEYS
from workers.runtime.manifest import verify_checkpoint
from workers.runtime.reporter import EventReporter
from workers.train.checkpoints import checkpoint_uri

log = logging.getLogger(__name__)


class RunEventForwarder(UserCallback):
    """Tells the control plane about every checkpoint Ray Train has persisted and registered.
    (Restarts of the worker group are reported by ``workers.train.failures.CauseAwareFailurePolicy``.)"""

    def __init__(self, url: str | None, job_id: str, attempt: int, token: str) -> None:
        self.url, self.job_id, self.attempt, self.token = url, job_id, attempt, token
        # Made on first use, in the controller actor: this object is pickled there, a thread can't be.
        self._reporter: EventReporter | None = None

    @property
    def reporter(self) -> EventReporter:
        if self._reporter is None:
            self._reporter = EventReporter(self.url, self.job_id, self.attempt, self.token)
        return self._reporter

    def after_report(self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Checkpoint | None) -> None:
        if checkpoint is None:
            return
        storage_path = str(run_context.run_config.storage_path)
        event = checkpoint_event(checkpoint, metrics[0] if metrics else {}, storage_path)
        if event is not None:  # an incomplete checkpoint is never recorded, so never becomes the latest
            self.reporter.emit(event)


def checkpoint_event(checkpoint: Checkpoint, metrics: dict[str, Any], storage_path: str) -> CheckpointEvent | None:
    """What the control plane records for one committed checkpoint (rank 0's metrics); None, with a
    warning, when the checkpoint is not complete (``workers.runtime.manifest``).

    The check reads the manifests and every file's size, not the bytes: it runs in Ray Train's
    controller, which every worker's ``ray.train.report`` waits on, and sizes are what a save cut short
    gets wrong. Checksums are checked where the bytes are read anyway: when a run resumes.
    """
    verification = verify_checkpoint(checkpoint.path, checkpoint.filesystem, checksums=False)
    if not verification:
        log.warning("not recording checkpoint %s: it is incomplete: %s", checkpoint.path, verification.problem)
        return None
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
