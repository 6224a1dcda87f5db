"""The training loop on a Ray Train worker: the ``TorchTrainer`` entry point and its ``LoopContext``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import ray.train
import ray.train.torch

from workers.train_loop import run_training


def train_loop_per_worker(config: dict) -> None:
    """Entry point handed to ``TorchTrainer``."""
    run_training(config, RayContext())


class RayContext:
    """Inside ``train_loop_per_worker``: Ray Train has set up the process group and the device."""

    def __init__(self) -> None:
        train_context = ray.train.get_context()
        self.rank = train_context.get_world_rank()
        self.world_size = train_context.get_world_size()
        self.device = ray.train.torch.get_device()

    @contextlib.contextmanager
    def resume_dir(self) -> Iterator[str | None]:
        checkpoint = ray.train.get_checkpoint()
        if checkpoint is None:
            yield None
            return
        with checkpoint.as_directory() as local_dir:
            yield local_dir

    def report(self, metrics: dict[str, Any], checkpoint_dir: str) -> None:
        # Ray Train merges the folders every rank reports into one checkpoint.
        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(checkpoint_dir))
