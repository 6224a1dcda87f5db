"""Everything the training loop needs from where it runs, behind one small object.

The loop talks only to a ``LoopContext`` (in the spirit of Determined's training contexts), so the
same loop runs on a Ray Train worker (``workers.train.ray_context.RayContext``), under plain ``torchrun``
or ``torch.multiprocessing``, and in one test process (``LocalContext``). The process group, where
there is one, is already initialised: Ray Train, ``workers.runtime.torchrun`` or the test sets it up.
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

from workers.runtime.distributed import is_distributed
from workers.runtime.manifest import CHECKPOINT_PREFIX, choose_resume_checkpoint, newest_verified_checkpoint


class LoopContext(Protocol):
    rank: int
    world_size: int
    device: torch.device

    def resume_dir(self) -> contextlib.AbstractContextManager[str | None]:
        """A local folder holding the checkpoint to resume from (None on a fresh start); only a checkpoint
        that verifies (``workers.runtime.manifest``), the same one on every rank."""

    def report(self, metrics: dict[str, Any], checkpoint_dir: str) -> None:
        """Commit a checkpoint: every rank calls it with its own folder; together they are one checkpoint."""

    def wait_committed(self, metrics: dict[str, Any]) -> None:
        """Return once the checkpoint just reported is committed (``checkpoint.wait_for_commit``)."""


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
        # A training function's ``should_preempt()`` on this context: no control plane asks here; set it (rank
        # 0's counts, as its poller's would) to play a preemption in a test.
        self.preempt_requested = False

    @contextlib.contextmanager
    def resume_dir(self) -> Iterator[str | None]:
        if not self.resume_from:
            yield None
            return
        # An incomplete checkpoint gives way to the newest complete one beside it (or a fresh start).
        chosen = choose_resume_checkpoint(self.resume_from) if self.rank == 0 else None
        yield rank0_choice(chosen)

    def wait_committed(self, metrics: dict[str, Any]) -> None:
        pass  # report() copies and waits for every rank: committed when it returns

    def report(self, metrics: dict[str, Any], checkpoint_dir: str) -> None:
        target = self.checkpoint_root / f"{CHECKPOINT_PREFIX}{int(metrics['step']):09d}"
        shutil.copytree(checkpoint_dir, target, dirs_exist_ok=True)
        if is_distributed():
            dist.barrier()  # the checkpoint is whole only once every rank has copied its part
        self.reported.append(dict(metrics))
        self.checkpoints.append(target)


def latest_checkpoint(checkpoint_root: str | os.PathLike) -> Path | None:
    """The newest complete checkpoint a ``LocalContext`` wrote under ``checkpoint_root``, if any."""
    newest = newest_verified_checkpoint(checkpoint_root)
    return Path(newest) if newest else None


def rank0_choice(choice: str | None) -> str | None:
    """Rank 0's ``choice`` on every rank: ranks must resume from the same checkpoint, so only rank 0
    verifies and chooses (a collective: every rank calls it)."""
    if not is_distributed() or dist.get_world_size() == 1:
        return choice
    box = [choice]
    dist.broadcast_object_list(box, src=0)
    return box[0]
