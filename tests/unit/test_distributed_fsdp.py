"""FSDP2 on 2 gloo ranks: each rank holds half the parameters and optimizer state, training matches
DDP, accumulation syncs gradients once per optimizer step, and every checkpoint carries the full model
that a Serve replica loads with weights_only. (Sharded checkpoints that resume exactly:
test_distributed_resume.py.)"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from orchestrator_contract.jobs import JobSpec, TrainingPlan
from tests.unit.harness import (
    TRANSFORMER,
    assert_same_state,
    job_config,
    model_state,
    run_on_ranks,
    train,
)
from workers.runtime.checkpoint_io import Position, save_checkpoint
from workers.runtime.data import TrainBatches
from workers.runtime.manifest import verify_checkpoint
from workers.runtime.step import TrainState, build_train_state, optimizer_step
from workers.workloads import load_workload

# A tight clip: clipping is active, so the global gradient norm over the shards must be right too.
SAME_JOB = {
    "epochs": 3,
    "batch": {"per_worker": 8},
    "optimizer": {"name": "adam"},
    "lr": {"base": 0.05},
    "grad_clip_norm": 0.5,
    "checkpoint": {"every_epochs": 3},  # no export_full: FSDP checkpoints carry model.pt anyway
}
MICRO_BATCHES, STEPS = 4, 2
FSDP_GROUPS = 3  # the two blocks and the root


def local_numel(tensor: torch.Tensor) -> int:
    return tensor.to_local().numel() if isinstance(tensor, DTensor) else tensor.numel()


CONFIG = {"samples": 128}
PROBE = torch.randint(0, 16, (4, 8), generator=torch.Generator().manual_seed(5))  # token ids: VOCAB x LENGTH


def _state(strategy: str, accumulation_steps: int = 1) -> tuple[TrainState, TrainBatches, object]:
    config = job_config(
        TRANSFORMER,
        strategy=strategy,
        config=CONFIG,
        optimizer={"name": "adam"},
        batch={"per_worker": 4, "accumulation_steps": accumulation_steps},
    )
    spec, plan = JobSpec.model_validate(config["spec"]), TrainingPlan.model_validate(config["plan"])
    torch.manual_seed(0)
    workload = load_workload(spec.workload)(spec.config, spec.seed)
    state = build_train_state(workload, spec, plan, torch.device("cpu"), world_size=2)
    batches = TrainBatches(
        workload.train_dataset,
        rank=dist.get_rank(),
        world_size=2,
        per_worker=4,
        accumulation_steps=accumulation_steps,
        seed=0,
    )
    return state, batches, workload.loss_fn


def _steps(state: TrainState, batches: TrainBatches, loss_fn, count: int) -> None:
    for micro_batches, _ in zip(batches.epoch(1), range(count), strict=False):
        optimizer_step(state, micro_batches, loss_fn, device=torch.device("cpu"), precision="fp32", grad_clip_norm=None)


def held_elements(strategy: str) -> dict[str, int]:
    """Parameter and optimizer-state elements this rank holds after one Adam step."""
    state, batches, loss_fn = _state(strategy)
    _steps(state, batches, loss_fn, 1)
    optimizer_state = [value for per_param in state.optimizer.state.values() for value in per_param.values()]
    return {
        "parameters": sum(local_numel(p) for p in state.model.parameters()),
        "optimizer": sum(local_numel(t) for t in optimizer_state if isinstance(t, torch.Tensor) and t.dim() > 0),
    }


def count_reduce_scatters(accumulation_steps: int) -> int:
    state, batches, loss_fn = _state("fsdp", accumulation_steps)
    calls = []
    original = dist.reduce_scatter_single  # what FSDP2 calls for every gradient reduce-scatter

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    dist.reduce_scatter_single = counting
    try:
        _steps(state, batches, loss_fn, STEPS)
    finally:
        dist.reduce_scatter_single = original
    return len(calls)


def checkpoint_and_outputs(root: str) -> dict:
    """Two FSDP steps, a checkpoint as the loop writes it (each rank its own folder), and the in-memory
    sharded model's outputs on PROBE."""
    state, batches, loss_fn = _state("fsdp")
    _steps(state, batches, loss_fn, STEPS)
    rank = dist.get_rank()
    folder = Path(root) / f"rank-{rank}"
    folder.mkdir(parents=True)
    save_checkpoint(
        folder,
        rank=rank,
        world_size=2,
        strategy="fsdp",
        state=state,
        position=Position(1, STEPS, STEPS),
        epoch_loss=torch.zeros(2),
    )
    state.model.eval()
    with torch.no_grad():
        return {"folder": str(folder), "outputs": state.model(PROBE)}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    work = tmp_path_factory.mktemp("fsdp")
    tasks = {
        "fsdp-held": (held_elements, {"strategy": "fsdp"}),
        "ddp-held": (held_elements, {"strategy": "ddp"}),
        "fsdp": (train, {"config": job_config(TRANSFORMER, strategy="fsdp", **SAME_JOB), "root": work / "fsdp"}),
        "ddp": (train, {"config": job_config(TRANSFORMER, strategy="ddp", **SAME_JOB), "root": work / "ddp"}),
        "reduce-scatters-accumulating": (count_reduce_scatters, {"accumulation_steps": MICRO_BATCHES}),
        "reduce-scatters-plain": (count_reduce_scatters, {"accumulation_steps": 1}),
        "checkpointed": (checkpoint_and_outputs, {"root": str(work / "checkpointed")}),
    }
    results = run_on_ranks(list(tasks.values()), work)
    return [dict(zip(tasks, rank_results, strict=True)) for rank_results in results]


@pytest.mark.parametrize("kind", ["parameters", "optimizer"])
def test_each_rank_holds_half_of_what_ddp_holds(runs, kind):
    full = runs[0]["ddp-held"][kind]
    shards = [rank["fsdp-held"][kind] for rank in runs]
    assert sum(shards) == full  # disjoint shards that cover everything
    for held in shards:
        assert 0.4 * full <= held <= 0.6 * full


def test_fsdp_trains_like_ddp(runs):
    fsdp, ddp = runs[0]["fsdp"], runs[0]["ddp"]
    assert fsdp["metrics"]["train_loss"] == pytest.approx(ddp["metrics"]["train_loss"], rel=1e-4)
    assert fsdp["metrics"]["val_loss"] == pytest.approx(ddp["metrics"]["val_loss"], rel=1e-4)
    assert fsdp["metrics"]["val_loss"] < 2.0  # it learned: chance is ln(16) = 2.77
    assert_same_state(model_state(fsdp["checkpoints"][-1]), model_state(ddp["checkpoints"][-1]), atol=1e-5, rtol=1e-4)


def test_accumulation_reduce_scatters_once_per_optimizer_step(runs):
    for rank in runs:
        assert rank["reduce-scatters-plain"] == STEPS * FSDP_GROUPS
        assert rank["reduce-scatters-accumulating"] == STEPS * FSDP_GROUPS  # not x4 micro-batches


def merged_checkpoint(runs, target: Path) -> Path:
    """The ranks' folders merged into one, as Ray Train does."""
    for rank in runs:
        shutil.copytree(rank["checkpointed"]["folder"], target, dirs_exist_ok=True)
    return target


def test_an_fsdp_checkpoint_carries_the_full_model_the_replica_loads_with_weights_only(runs, tmp_path):
    from workers.serve.app import load_serving_model

    checkpoint = merged_checkpoint(runs, tmp_path / "checkpoint_000002")
    assert (checkpoint / "sharded").is_dir() and verify_checkpoint(checkpoint)
    rank0 = json.loads((checkpoint / "manifests" / "rank-00000.json").read_text())
    assert "model.pt" in rank0["files"]  # gathered by rank 0 at save time, and verified with the rest
    served = load_serving_model(str(checkpoint), TRANSFORMER, CONFIG)
    in_memory = runs[0]["checkpointed"]["outputs"]
    torch.testing.assert_close(served(PROBE), in_memory, atol=1e-5, rtol=1e-5)


def test_the_export_command_rebuilds_the_full_model_from_fsdp_shards_alone(runs, tmp_path):
    """A checkpoint saved before FSDP ones carried model.pt: the operator's command reads the real FSDP2
    shards without unpickling and writes the same model."""
    from workers.serve.app import load_serving_model
    from workers.train.export_full import export_full_model

    checkpoint = merged_checkpoint(runs, tmp_path / "checkpoint_000002")
    (checkpoint / "model.pt").unlink()
    manifest = checkpoint / "manifests" / "rank-00000.json"
    listed = json.loads(manifest.read_text())
    del listed["files"]["model.pt"]
    manifest.write_text(json.dumps(listed))
    with pytest.raises(ValueError, match="only FSDP shards"):
        load_serving_model(str(checkpoint), TRANSFORMER, CONFIG)

    assert export_full_model(str(checkpoint)).startswith("wrote")
    assert verify_checkpoint(checkpoint)
    served = load_serving_model(str(checkpoint), TRANSFORMER, CONFIG)
    torch.testing.assert_close(served(PROBE), runs[0]["checkpointed"]["outputs"], atol=1e-5, rtol=1e-5)
