"""Everything the training loop needs from where it runs, behind one small object.

The loop talks only to a ``LoopContext`` (in the spirit of Determined's training contexts), so the
same loop runs on a Ray Train worker (``workers.ray_context.RayContext``), under plain ``torchrun``
or ``torch.multiprocessing``, and in one test process (``LocalContext``). The process group, where
there is one, is already initialised: Ray Train, ``workers.torchrun`` or the test sets it up.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist

from workers.distributed import is_distributed

CHECKPOINT_PREFIX = "checkpoint_"


class LoopContext(Protocol):
    rank: int
    world_size: int
    device: torch.device

    def resume_dir(self) -> contextlib.AbstractContextManager[str | None]:
        """A local folder holding the checkpoint to resume from (None on a fresh start)."""

    def report(self, metrics: dict[str, Any], checkpoint_dir: str) -> None:
        """Commit a checkpoint: every rank calls it with its own folder; together they are one checkpoint."""


class LocalContext:
    """No Ray: a single process, or one rank of the torch.distributed group this process is in.

    Every rank's part of a checkpoint is copied into ``checkpoint_root/checkpoint_<step>``
    (``metrics["step"]`` names it), a folder all ranks can reach (one machine, or shared storage).
    """

    def __init__(
        self,
        checkpoint_root: str | os.PathLike,
        resume_from: str | os.PathLike | None = None,
        device: torch.device | None = None,
    ) -> None:
        self.rank = dist.get_rank() if is_distributed() else 0
        self.world_size = dist.get_world_size() if is_distributed() else 1
        self.device = device or torch.device("cpu")
        self.checkpoint_root = Path(checkpoint_root)
        self.resume_from = resume_from
        self.checkpoints: list[Path] = []
        self.reported: list[dict[str, Any]] = []

    @contextlib.contextmanager
    def resume_dir(self) -> Iterator[str | None]:
        yield str(self.resume_from) if self.resume_from else None

    def report(self, metrics: dict[str, Any], checkpoint_dir: str) -> None:
        target = self.checkpoint_root / f"{CHECKPOINT_PREFIX}{int(metrics['step']):09d}"
        shutil.copytree(checkpoint_dir, target, dirs_exist_ok=True)
        if is_distributed():
            dist.barrier()  # the checkpoint is whole only once every rank has copied its part
        self.reported.append(dict(metrics))
        self.checkpoints.append(target)


def latest_checkpoint(checkpoint_root: str | os.PathLike) -> Path | None:
    """The newest checkpoint a ``LocalContext`` wrote under ``checkpoint_root``, if any."""
    return max(Path(checkpoint_root).glob(f"{CHECKPOINT_PREFIX}*"), default=None)
