"""Everything the training loop needs from its distributed environment, behind one small object.

The loop talks only to a ``LoopContext`` (in the spirit of Determined's training contexts), so the
same loop runs on a Ray Train worker (``RayContext``) and in-process in a test (``LocalContext``).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Protocol

import ray.train
import ray.train.torch
import torch
import torch.distributed as dist
from torch import nn

from workers.checkpoints import load_checkpoint


class LoopContext(Protocol):
    rank: int
    world_size: int
    device: torch.device

    def prepare_model(self, model: nn.Module) -> nn.Module:
        """Move the model to the device and wrap it for data parallelism where there is any."""

    def all_reduce_sum(self, tensor: torch.Tensor) -> None:
        """Sum ``tensor`` in place over all ranks."""

    def latest_checkpoint(self) -> dict[str, Any] | None:
        """The state to resume from, or None on a fresh start."""

    def report(self, metrics: dict[str, Any], checkpoint_dir: str | None) -> None:
        """Commit a checkpoint (rank 0 passes its folder, other ranks None). Every rank calls it."""


class RayContext:
    """Inside ``train_loop_per_worker`` of a Ray Train ``TorchTrainer``."""

    def __init__(self) -> None:
        train_context = ray.train.get_context()
        self.rank = train_context.get_world_rank()
        self.world_size = train_context.get_world_size()
        self.device = ray.train.torch.get_device()

    def prepare_model(self, model: nn.Module) -> nn.Module:
        return ray.train.torch.prepare_model(model)

    def all_reduce_sum(self, tensor: torch.Tensor) -> None:
        if self.world_size > 1:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)

    def latest_checkpoint(self) -> dict[str, Any] | None:
        checkpoint = ray.train.get_checkpoint()
        if checkpoint is None:
            return None
        with checkpoint.as_directory() as local_dir:
            return load_checkpoint(local_dir)

    def report(self, metrics: dict[str, Any], checkpoint_dir: str | None) -> None:
        checkpoint = ray.train.Checkpoint.from_directory(checkpoint_dir) if checkpoint_dir else None
        ray.train.report(metrics, checkpoint=checkpoint)


class LocalContext:
    """One process, world size 1: checkpoints are copied to ``checkpoint_root/checkpoint_NNNNNN``."""

    def __init__(self, checkpoint_root: str | os.PathLike, resume_from: str | os.PathLike | None = None):
        self.rank = 0
        self.world_size = 1
        self.device = torch.device("cpu")
        self.checkpoint_root = Path(checkpoint_root)
        self.resume_from = resume_from
        self.checkpoints: list[Path] = []
        self.reported: list[dict[str, Any]] = []

    def prepare_model(self, model: nn.Module) -> nn.Module:
        return model.to(self.device)

    def all_reduce_sum(self, tensor: torch.Tensor) -> None:
        pass  # one rank: the local sum is the total

    def latest_checkpoint(self) -> dict[str, Any] | None:
        return load_checkpoint(self.resume_from) if self.resume_from else None

    def report(self, metrics: dict[str, Any], checkpoint_dir: str | None) -> None:
        self.reported.append(dict(metrics))
        if checkpoint_dir:
            target = self.checkpoint_root / f"checkpoint_{len(self.checkpoints):06d}"
            shutil.copytree(checkpoint_dir, target)
            self.checkpoints.append(target)
