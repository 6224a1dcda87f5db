"""The training loop on a Ray Train worker: the ``TorchTrainer`` entry point and its ``LoopContext``."""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Iterator
from typing import Any

import ray
import ray.train
import ray.train.torch
import torch.distributed as dist

from orchestrator_contract.logs import rank_marker
from workers.runtime.context import rank0_choice
from workers.runtime.function import run_function
from workers.runtime.manifest import choose_resume_checkpoint, resolve
from workers.runtime.train_loop import PREEMPTED_KEY, run_training

UPLOAD_POLL_S = 0.05  # how often a checkpoint waiting for the one before looks whether its upload is done


def train_loop_per_worker(config: dict) -> dict[str, float] | None:
    """Entry point handed to ``TorchTrainer``: the training loop for a workload, the user's function for an
    entrypoint. A function's last metrics are its return value (rank 0's is the run's ``return_value``)."""
    ctx = RayContext(config.get("start_from"))
    # First, before any output of ours or the user's: the line that tells the log's readers this process's rank.
    print(rank_marker(ctx.rank, ctx.world_size, os.getpid(), socket.gethostname()), flush=True)
    if config["spec"].get("entrypoint"):
        return run_function(config, ctx)
    result = run_training(config, ctx)
    # Preempted: the driver must know it stopped early (it reports no outcome then, and exits PREEMPTED).
    return result if PREEMPTED_KEY in result else None


def rank_nodes(world_size: int) -> list[str]:
    """Every rank's Ray node id, by rank (a collective: every rank calls it)."""
    node_id = ray.get_runtime_context().get_node_id()
    if world_size == 1:
        return [node_id]
    gathered: list = [None] * world_size
    dist.all_gather_object(gathered, node_id)
    return [str(node) for node in gathered]


class RayContext:
    """Inside ``train_loop_per_worker``: Ray Train has set up the process group and the device.

    ``start_from``: a checkpoint (path or URI) a new run starts from when it has none of its own yet
    (Ray Train V2 has no ``resume_from_checkpoint``); a PBT trial continuing another trial's checkpoint.
    """

    def __init__(self, start_from: str | None = None) -> None:
        train_context = ray.train.get_context()
        self.rank = train_context.get_world_rank()
        self.world_size = train_context.get_world_size()
        self.device = ray.train.torch.get_device()
        self.start_from = start_from
        self._uploading: str | None = None  # the folder of this rank's asynchronous upload in flight
        self.rank_nodes = rank_nodes(self.world_size)  # rank 0 reports them with ``running`` (bad nodes)

    @contextlib.contextmanager
    def resume_dir(self) -> Iterator[str | None]:
        # Ray Train's latest registered checkpoint (else start_from), if it verifies; else the newest one
        # beside it that does (a crash may have cut the latest short); else a fresh start. Rank 0 decides.
        checkpoint = ray.train.get_checkpoint()
        if checkpoint is not None:
            filesystem, location = checkpoint.filesystem, checkpoint.path
        elif self.start_from:
            filesystem, location = resolve(self.start_from)
        else:
            yield None
            return
        chosen = choose_resume_checkpoint(location, filesystem) if self.rank == 0 else None
        chosen = rank0_choice(chosen)
        if chosen is None:
            yield None
            return
        # A local folder is used as it is; a checkpoint in remote storage is downloaded.
        with ray.train.Checkpoint(chosen, filesystem=filesystem).as_directory() as local_dir:
            yield local_dir

    def wait_committed(self, metrics: dict[str, Any]) -> None:
        # ray.train.report returns once its report is queued (one per worker) and the controller takes it
        # at its next poll. A second report, of the same metrics and no checkpoint, can only be queued
        # after the first was taken, so when it returns the checkpoint has been handed to the controller.
        ray.train.report(metrics)

    def report(self, metrics: dict[str, Any], checkpoint_dir: str, *, asynchronous: bool = False) -> None:
        # Ray Train merges the folders every rank reports into one checkpoint. Asynchronous: its one upload thread
        # copies the folder to storage, deletes it, then registers the checkpoint; the folder's going is how this
        # rank knows its upload is done, and the next checkpoint waits for it (one in flight, bounded disk).
        self._wait_for_upload()
        mode = ray.train.CheckpointUploadMode.ASYNC if asynchronous else ray.train.CheckpointUploadMode.SYNC
        ray.train.report(
            metrics, checkpoint=ray.train.Checkpoint.from_directory(checkpoint_dir), checkpoint_upload_mode=mode
        )
        self._uploading = checkpoint_dir if asynchronous else None

    def _wait_for_upload(self) -> None:
        """Until this rank's asynchronous upload is done. A failed upload fails the worker group (Ray Train
        raises it in the training thread), which ends this wait with the worker."""
        while self._uploading is not None and os.path.exists(self._uploading):
            time.sleep(UPLOAD_POLL_S)
        self._uploading = None
