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

import copy
import logging
import os
import sys
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
    files, sharded = checkpoint_state(
        rank=rank, strategy=strategy, state=state, position=position, epoch_loss=epoch_loss
    )
    write_checkpoint_files(directory, files, rank=rank, world_size=world_size, sharded=sharded)


def checkpoint_state(
    *, rank: int, strategy: str, state: TrainState, position: Position, epoch_loss: torch.Tensor
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """This rank's part of a checkpoint, live (not a copy): ``checkpoint_files``, and for FSDP the state dict that
    DCP saves into ``sharded/`` (this rank's shards of the model and optimizer, as DTensors) with rank 0's gathered
    ``model.pt`` among the files; None for the others. Every rank must call it: FSDP's are collectives on the
    training group, so it runs on the loop, an asynchronous checkpoint's too."""
    files = checkpoint_files(rank=rank, strategy=strategy, state=state, position=position, epoch_loss=epoch_loss)
    if strategy != "fsdp":
        return files, None
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_state_dict

    model_state, optimizer_state = get_state_dict(state.model, state.optimizer)
    # The full model too, gathered here by the run that owns the shards: a replica then loads tensors only.
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    full = get_model_state_dict(state.model, options=options)  # a collective; only rank 0 receives it
    if rank == 0:
        files[MODEL_FILE] = full
    return files, {"model": model_state, "optimizer": optimizer_state}


def checkpoint_files(
    *, rank: int, strategy: str, state: TrainState, position: Position, epoch_loss: torch.Tensor
) -> dict[str, Any]:
    """This rank's files as the objects ``torch.save`` writes, by path in the checkpoint: every one but FSDP's
    (its ``sharded/`` folder and gathered ``model.pt`` take collectives). The live state, not a copy."""
    files: dict[str, Any] = {f"{RANKS_DIR}/{_rank_file(rank)}": {"rng": capture_rng(), "epoch_loss": epoch_loss.cpu()}}
    if rank != 0:
        return files
    train_state = {
        "strategy": strategy,
        "epoch": position.epoch,
        "epoch_steps": position.epoch_steps,
        "step": position.step,
        "scheduler": state.scheduler.state_dict(),
        "scaler": state.scaler.state_dict(),
    }
    if strategy != "fsdp":
        files[MODEL_FILE] = unwrap(state.model).state_dict()
        train_state["optimizer"] = state.optimizer.state_dict()
    files[TRAIN_STATE_FILE] = train_state
    return files


def snapshot(files: Any, buffers: dict[tuple, Any] | None = None) -> Any:
    """A copy of ``checkpoint_files`` that training can no longer change, on the CPU: state dicts hold the live
    parameters, optimizer moments and scheduler lists. What is shared stays shared (a tensor under two names, tied
    weights on one storage), so the copy saves to the same bytes as the original.

    ``buffers``: the host storages of the previous snapshot, by source storage, copied into again rather than
    allocated (four times faster here: no fresh pages to fault in); left holding this snapshot's. Only when
    nothing still reads the previous snapshot."""
    copier = _HostCopier(reused=buffers if buffers is not None else {})
    copied = copier.copy(files)
    if buffers is not None:
        buffers.clear()
        buffers.update(copier.storages)
    return copied


class _HostCopier:
    """One snapshot's memo: each tensor copied once, each storage copied once (into a reused buffer if any)."""

    def __init__(self, reused: dict[tuple, Any]) -> None:
        self.reused = reused
        self.tensors: dict[int, torch.Tensor] = {}
        self.storages: dict[tuple, Any] = {}

    def copy(self, value: Any) -> Any:
        if _is_dtensor(value):  # FSDP's shards: this rank's local tensor copied, the same placement on the mesh
            if id(value) not in self.tensors:
                dtensor = sys.modules["torch.distributed.tensor"].DTensor
                local = self.copy(value._local_tensor)  # as DCP's own stager copies it
                self.tensors[id(value)] = dtensor(local, value._spec, requires_grad=False)
            return self.tensors[id(value)]
        if isinstance(value, torch.Tensor):
            if id(value) not in self.tensors:
                host = self._storage(value.untyped_storage())
                copied = torch.empty(0, dtype=value.dtype)
                self.tensors[id(value)] = copied.set_(host, value.storage_offset(), value.size(), value.stride())
            return self.tensors[id(value)]
        if isinstance(value, dict):
            copied = copy.copy(value)  # its own type (OrderedDict, defaultdict), its own items below
            copied.update((key, self.copy(item)) for key, item in value.items())
            return copied
        if isinstance(value, list | tuple):
            items = [self.copy(item) for item in value]
            return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)  # a namedtuple too
        return copy.deepcopy(value)

    def _storage(self, storage: Any) -> Any:
        key = (storage.device, storage.data_ptr(), storage.nbytes())
        if key not in self.storages:
            if key in self.reused:
                self.storages[key] = self.reused[key].copy_(storage)
            else:
                self.storages[key] = storage.clone() if storage.device.type == "cpu" else storage.cpu()
        return self.storages[key]


def write_checkpoint_files(
    directory: str | os.PathLike,
    files: dict[str, Any],
    *,
    rank: int,
    world_size: int,
    sharded: dict[str, Any] | None = None,
    process_group: Any = None,
) -> None:
    """``torch.save`` each of ``files`` into ``directory``, then this rank's manifest. It runs on the training thread
    or, for an asynchronous checkpoint, on ``CheckpointWriter``'s. ``sharded`` (FSDP, ``checkpoint_state``): saved
    first into ``sharded/`` with DCP, a collective on ``process_group`` (every rank calls it at the same checkpoint;
    None: the default group, which only the training thread may use); nothing else here is a collective."""
    directory = Path(directory)
    if sharded is not None:
        import torch.distributed.checkpoint as dcp  # here, not at the top: see workers/runtime/distributed.py

        dcp.save(sharded, checkpoint_id=directory / SHARDED_DIR, process_group=process_group)
    for relative, value in files.items():
        path = directory / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(value, path)
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


def _is_dtensor(value: Any) -> bool:
    """A DTensor; a process that never imported DTensor (a DDP run: it costs a second of CPU) has none."""
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(value, module.DTensor)


def _rank_file(rank: int) -> str:
    return f"rank-{rank:05d}.pt"
