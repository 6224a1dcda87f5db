"""Asynchronous FSDP checkpoints (``checkpoint.async``, docs/jobs.md "Asynchronous checkpoints"), on 2 gloo ranks.

The loop takes the sharded state dict and gathers ``model.pt`` (collectives on the training group), copies this
rank's shards to the CPU and trains on; ``CheckpointWriter``'s thread saves the shards with DCP on a gloo group of
its own, then the other files and the manifest, then reports. Proved here: the same run with async on and off writes
the same checkpoints (every file byte-equal but DCP's ``.metadata``, which names its own folder and save id, and
the manifests that hash it; every model and optimizer tensor equal once read back with the repo's DCP reader); a run
resumed from an asynchronous mid-epoch checkpoint ends with exactly the parameters of the uninterrupted run; and the
loop goes on training while a shard write is held back. (DDP: tests/unit/test_async_checkpoints.py.)
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from tests.unit.harness import TRANSFORMER, RecordingReporter, job_config, model_state, run_on_ranks, train
from tests.unit.test_async_checkpoints import StepWatcher, files_of
from workers.runtime import checkpoint_writer
from workers.runtime.checkpoint_io import snapshot
from workers.runtime.context import LocalContext
from workers.runtime.dcp_reader import SafeShardReader, TensorsOnlyLoadPlanner
from workers.runtime.train_loop import run_training

MID_EPOCH = "checkpoint_000000006"  # epoch 2, 2 of its 4 steps done
HELD_STEP = 3
# Differ between any two saves: DCP's metadata records the folder it was saved into and a fresh save id.
NOT_COMPARED = {"sharded/.metadata", "manifests/rank-00000.json", "manifests/rank-00001.json"}


def config(asynchronous: bool, **overrides) -> dict:
    fields = {
        "config": {"dropout": 0.2},
        "batch": {"per_worker": 8},
        "optimizer": {"name": "adamw", "weight_decay": 0.01},
        "lr": {"base": 0.02, "warmup_steps": 3},
        "epochs": 3,
        "grad_clip_norm": 1.0,
        "checkpoint": {"every_epochs": 1, "every_steps": 3, "keep": 100, "async": asynchronous},
        **overrides,
    }
    return job_config(TRANSFORMER, strategy="fsdp", **fields)


def train_holding_a_write(root: str) -> dict:
    """An asynchronous FSDP run whose step-3 write is held on rank 0, before its shards are saved, until rank 0's
    loop has reported a later step (rank 1's write waits in DCP's collective meanwhile). A loop that waited for the
    write would never report it: the hold gives up after 20 s and ``held`` says False."""
    reporter = StepWatcher(step=HELD_STEP) if dist.get_rank() == 0 else None
    real_write, held = checkpoint_writer.write_checkpoint_files, []

    def held_write(folder, files, **kwargs):
        if reporter is not None and files["train_state.pt"]["step"] == HELD_STEP:
            held.append(reporter.trained_past.wait(20))
        real_write(folder, files, **kwargs)

    checkpoint_writer.write_checkpoint_files = held_write
    try:
        ctx = LocalContext(root)
        run_training(config(True, metrics_every_steps=1), ctx, reporter or RecordingReporter())
    finally:
        checkpoint_writer.write_checkpoint_files = real_write
    return {"held": held, "checkpoints": [str(path) for path in ctx.checkpoints]}


def snapshot_of_a_shard() -> dict:
    """A DTensor sharded over the 2 ranks, snapshot, then changed in place as an optimizer step changes it."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (2,))
    live = distribute_tensor(torch.arange(8.0), mesh, [Shard(0)])
    buffers: dict = {}
    copied = snapshot({"weight": live, "tied": live}, buffers)["weight"]
    before = copied.to_local().clone()
    live.to_local().add_(100.0)
    return {
        "dtensor": isinstance(copied, DTensor) and copied.placements == live.placements,
        "shape": tuple(copied.shape),
        "local": before.tolist(),
        "unchanged": torch.equal(copied.to_local(), before),
        "own_memory": copied.to_local().data_ptr() != live.to_local().data_ptr(),
        "buffers": len(buffers),
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, dict]:
    work = tmp_path_factory.mktemp("async-fsdp-checkpoints")
    tasks = [
        (train, {"config": config(False), "root": work / "sync"}),
        (train, {"config": config(True), "root": work / "async"}),
        (train, {"config": config(True), "root": work / "resumed", "resume_from": work / "async" / MID_EPOCH}),
        (train_holding_a_write, {"root": str(work / "held")}),
        (snapshot_of_a_shard, {}),
    ]
    (sync, asynchronous, resumed, held, shard0), (_, _, _, held_rank1, shard1) = run_on_ranks(tasks, work)
    return {
        "sync": sync,
        "async": asynchronous,
        "resumed": resumed,
        "held": held,
        "held-rank1": held_rank1,
        "shards": [shard0, shard1],
    }


def sharded_tensors(checkpoint: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of ``sharded/`` (model and optimizer, whole), read with the repo's DCP reader in one process."""
    reader = SafeShardReader(Path(checkpoint) / "sharded")
    metadata = reader.read_metadata()
    tensors = {
        fqn: torch.empty(entry.size, dtype=entry.properties.dtype)
        for fqn, entry in metadata.state_dict_metadata.items()
        if isinstance(entry, TensorStorageMetadata)
    }
    dcp.load(tensors, storage_reader=reader, planner=TensorsOnlyLoadPlanner(), no_dist=True)
    return tensors


def test_async_and_sync_fsdp_checkpoints_hold_the_same_state(runs):
    sync, asynchronous = runs["sync"]["checkpoints"], runs["async"]["checkpoints"]
    assert [Path(c).name for c in sync] == [Path(c).name for c in asynchronous]
    assert len(sync) == 6  # steps 3, 6 and 9 mid-epoch, and the 3 epoch ends (4, 8, 12)
    for a, b in zip(sync, asynchronous, strict=True):
        sync_files, async_files = files_of(a), files_of(b)
        assert sync_files.keys() == async_files.keys(), (a, b)
        assert {"model.pt", "train_state.pt", "sharded/__0_0.distcp", "sharded/__1_0.distcp"} <= sync_files.keys()
        different = [n for n in sync_files.keys() - NOT_COMPARED if sync_files[n] != async_files[n]]
        assert not different, f"{Path(a).name}: {different}"
        sync_shards, async_shards = sharded_tensors(a), sharded_tensors(b)
        assert sync_shards.keys() == async_shards.keys()
        assert any(k.startswith("model.") for k in sync_shards) and any("exp_avg_sq" in k for k in sync_shards)
        unequal = [k for k in sync_shards if not torch.equal(sync_shards[k], async_shards[k])]
        assert not unequal, f"{Path(a).name}: {unequal}"


def test_a_run_resumed_from_an_async_fsdp_checkpoint_ends_exactly_where_the_uninterrupted_run_does(runs):
    assert runs["resumed"]["checkpoints"][0].endswith("checkpoint_000000008")  # the next after step 6
    straight, resumed = model_state(runs["sync"]["checkpoints"][-1]), model_state(runs["resumed"]["checkpoints"][-1])
    assert straight.keys() == resumed.keys()
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)
    final_sync = sharded_tensors(runs["sync"]["checkpoints"][-1])
    final_resumed = sharded_tensors(runs["resumed"]["checkpoints"][-1])
    assert all(torch.equal(final_sync[k], final_resumed[k]) for k in final_sync)  # the optimizer's too
    assert runs["resumed"]["metrics"]["train_loss"] == runs["sync"]["metrics"]["train_loss"]


def test_the_loop_trains_on_while_its_fsdp_shards_are_written(runs):
    assert runs["held"]["held"] == [True]
    assert runs["held-rank1"]["held"] == []
    assert [Path(c).name for c in runs["held"]["checkpoints"]] == [Path(c).name for c in runs["sync"]["checkpoints"]]


def test_a_snapshot_copies_each_ranks_shard_and_keeps_it_a_dtensor(runs):
    for rank, shard in enumerate(runs["shards"]):
        assert shard["dtensor"] and shard["shape"] == (8,) and shard["unchanged"] and shard["own_memory"]
        assert shard["local"] == [float(i) for i in range(4 * rank, 4 * rank + 4)]
        assert shard["buffers"] == 1  # the tied name shares the copy


def test_a_sharded_checkpoint_needs_a_group_of_its_own(tmp_path, monkeypatch):
    monkeypatch.setattr(checkpoint_writer, "is_distributed", lambda: True)
    writer = checkpoint_writer.CheckpointWriter(LocalContext(tmp_path))
    with pytest.raises(ValueError, match="process group of its own"):
        writer.submit({}, {"step": 1}, sharded={"model": {}})
    assert writer._thread is None  # nothing started
