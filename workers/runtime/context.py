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
import threading
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
    rank_nodes: list[str] | None  # each rank's Ray node id, by rank; None where there is no Ray

    def resume_dir(self) -> contextlib.AbstractContextManager[str | None]:
        """A local folder holding the checkpoint to resume from (None on a fresh start); only a checkpoint
        that verifies (``workers.runtime.manifest``), the same one on every rank."""

    def report(self, metrics: dict[str, Any], checkpoint_dir: str, *, asynchronous: bool = False) -> None:
        """Commit a checkpoint: every rank calls it with its own folder; together they are one checkpoint.
        ``asynchronous`` (``checkpoint.async``): return before it is committed; the folder is then the context's,
        deleted once committed, and a checkpoint reported before that waits for it first (one in flight)."""

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
        self.rank_nodes: list[str] | None = None  # no Ray nodes here
        self.checkpoint_root = Path(checkpoint_root)
        self.resume_from = resume_from
        self.checkpoints: list[Path] = []
        self.reported: list[dict[str, Any]] = []
        # A training function's ``should_preempt()`` on this context: no control plane asks here; set it (rank
        # 0's counts, as its poller's would) to play a preemption in a test.
        self.preempt_requested = False
        self._copying: threading.Thread | None = None  # an asynchronous report's copy in flight
        # Reports wait for every rank on a group of their own: the loop's CheckpointWriter reports from its thread
        # while the loop's collectives go on (created here, when every rank constructs its context).
        self._report_group = dist.new_group(backend="gloo") if is_distributed() else None

    @contextlib.contextmanager
    def resume_dir(self) -> Iterator[str | None]:
        if not self.resume_from:
            yield None
            return
        # An incomplete checkpoint gives way to the newest complete one beside it (or a fresh start).
        chosen = choose_resume_checkpoint(self.resume_from) if self.rank == 0 else None
        yield rank0_choice(chosen)

    def wait_committed(self, metrics: dict[str, Any]) -> None:
        # A synchronous report() copies and waits for every rank: committed when it returns. An asynchronous one
        # is committed once its copy is done on every rank.
        self._join_copy()

    def report(self, metrics: dict[str, Any], checkpoint_dir: str, *, asynchronous: bool = False) -> None:
        self._join_copy()  # one in flight: the one before is committed first
        target = self.checkpoint_root / f"{CHECKPOINT_PREFIX}{int(metrics['step']):09d}"
        if not asynchronous:
            self._copy(checkpoint_dir, target, metrics)
            if is_distributed():
                dist.barrier(group=self._report_group)  # the checkpoint is whole once every rank copied its part
            return
        # As Ray Train's background upload: the copy in a thread, the folder deleted after it.
        self._copying = threading.Thread(
            target=self._copy, args=(checkpoint_dir, target, metrics, True), name="checkpoint-copy", daemon=True
        )
        self._copying.start()

    def _copy(self, source: str, target: Path, metrics: dict[str, Any], owned: bool = False) -> None:
        shutil.copytree(source, target, dirs_exist_ok=True)
        if owned:
            shutil.rmtree(source, ignore_errors=True)
        self.reported.append(dict(metrics))
        self.checkpoints.append(target)

    def _join_copy(self) -> None:
        """Wait for an asynchronous report's copy on this rank, then on every rank (every rank reports and waits
        at the same points, so every rank has one in flight or none)."""
        copying, self._copying = self._copying, None
        if copying is None:
            return
        copying.join()
        if is_distributed():
            dist.barrier(group=self._report_group)


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
