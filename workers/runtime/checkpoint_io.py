"""What a training checkpoint holds, and how every rank writes its part and reads it back.

Every rank writes into its own folder and all of them are handed to Ray Train, which merges them
into one checkpoint folder (elsewhere, ``LocalContext`` copies them together):

    train_state.pt       rank 0: position (epoch, step), LR scheduler, grad scaler; DDP: optimizer too
    model.pt             rank 0: the full model state dict (DDP, and FSDP gathered from the shards): what serving loads
    sharded/             FSDP: model and optimizer with torch.distributed.checkpoint, one file per rank
    ranks/rank-NNNNN.pt  each rank: its RNG states and its running loss sums of the epoch
    manifests/rank-NNNNN.json  each rank, written last: its files' sizes and SHA-256 (``workers.runtime.manifest``)

Only tensors and plain values go in: everything loads with ``weights_only=True`` or with DCP. Serving
reads only ``model.pt`` (``weights_only=True``), never ``sharded/``: DCP writes its ``.metadata`` with pickle,
and a file in storage may have been planted by other code on the cluster (docs/security.md, finding 5).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from orchestrator_contract.checkpoints import MODEL_FILE, SHARDED_DIR
from workers.runtime.distributed import unwrap
from workers.runtime.manifest import write_manifest
from workers.runtime.rng import capture_rng, restore_rng
from workers.runtime.step import TrainState

log = logging.getLogger(__name__)

TRAIN_STATE_FILE = "train_state.pt"
RANKS_DIR = "ranks"


@dataclass(frozen=True)
class Position:
    """Where training stands: ``epoch_steps`` optimizer steps of ``epoch`` (from 1) are done."""

    epoch: int
    epoch_steps: int
    step: int  # optimizer steps since the start of the job


def load(path: str | os.PathLike) -> Any:
    return torch.load(path, weights_only=True, map_location="cpu")


def save_checkpoint(
    directory: str | os.PathLike,
    *,
    rank: int,
    world_size: int,
    strategy: str,
    state: TrainState,
    position: Position,
    epoch_loss: torch.Tensor,
) -> None:
    """Write this rank's part, then its manifest. Every rank must call it (FSDP gathers are collectives)."""
    directory = Path(directory)
    (directory / RANKS_DIR).mkdir()
    torch.save({"rng": capture_rng(), "epoch_loss": epoch_loss.cpu()}, directory / RANKS_DIR / _rank_file(rank))
    train_state = {
        "strategy": strategy,
        "epoch": position.epoch,
        "epoch_steps": position.epoch_steps,
        "step": position.step,
        "scheduler": state.scheduler.state_dict(),
        "scaler": state.scaler.state_dict(),
    }
    if strategy == "fsdp":
        import torch.distributed.checkpoint as dcp  # here, not at the top: see workers/runtime/distributed.py
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_state_dict

        model_state, optimizer_state = get_state_dict(state.model, state.optimizer)
        dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=directory / SHARDED_DIR)
        # The full model too, gathered here by the run that owns the shards: a replica then loads tensors only.
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        full = get_model_state_dict(state.model, options=options)  # a collective; only rank 0 receives it
        if rank == 0:
            torch.save(full, directory / MODEL_FILE)
    elif rank == 0:
        torch.save(unwrap(state.model).state_dict(), directory / MODEL_FILE)
        train_state["optimizer"] = state.optimizer.state_dict()
    if rank == 0:
        torch.save(train_state, directory / TRAIN_STATE_FILE)
    # Last: a checkpoint whose manifests are not all there, or whose files don't match them, is incomplete.
    write_manifest(directory, rank=rank, world_size=world_size)


def restore_checkpoint(
    directory: str | os.PathLike, *, rank: int, strategy: str, state: TrainState
) -> tuple[Position, torch.Tensor | None]:
    """Load a checkpoint into ``state`` and this rank's RNGs; returns the position and the epoch's
    loss sums so far (None when this rank has no file: the group was larger before).

    Call it last before training: the RNG states it restores must be the next ones used.
    """
    directory = Path(directory)
    train_state = load(directory / TRAIN_STATE_FILE)
    if train_state["strategy"] != strategy:
        raise ValueError(
            f"checkpoint {directory} was written by a {train_state['strategy']} run; this run uses {strategy}"
        )
    if strategy == "fsdp":
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        from workers.runtime.dcp_reader import SafeShardReader, TensorsOnlyLoadPlanner

        model_state, optimizer_state = get_state_dict(state.model, state.optimizer)
        sharded = {"model": model_state, "optimizer": optimizer_state}
        # Not DCP's pickle.load of .metadata (nor weights_only=False for non-tensors): the folder is on storage
        # that other code on the cluster can write to.
        dcp.load(
            sharded,
            storage_reader=SafeShardReader(directory / SHARDED_DIR),
            planner=TensorsOnlyLoadPlanner(),
        )
        set_state_dict(
            state.model, state.optimizer, model_state_dict=sharded["model"], optim_state_dict=sharded["optimizer"]
        )
    else:
        unwrap(state.model).load_state_dict(load(directory / MODEL_FILE))
        state.optimizer.load_state_dict(train_state["optimizer"])
    state.scheduler.load_state_dict(train_state["scheduler"])
    state.scaler.load_state_dict(train_state["scaler"])
    position = Position(train_state["epoch"], train_state["epoch_steps"], train_state["step"])

    rank_path = directory / RANKS_DIR / _rank_file(rank)
    if not rank_path.exists():
        log.warning(
            "%s has no state for rank %d: its random draws will differ from an uninterrupted run", directory, rank
        )
        return position, None
    rank_state = load(rank_path)
    restore_rng(rank_state["rng"])
    return position, rank_state["epoch_loss"]


def _rank_file(rank: int) -> str:
    return f"rank-{rank:05d}.pt"
