"""Shared by the ``test_distributed_*`` files (no tests here): tiny workloads, job configs, and a runner
that executes tasks on every rank of a fresh process group (``torch.multiprocessing``, no Ray): 2 gloo
ranks on the CPU, or NCCL ranks on CUDA, one GPU each.

The workloads are custom workloads by name (``tests.unit.harness:mlp``), so the
loop loads them exactly as it loads a user's package, in the test process and in the spawned ranks.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.utils.data import TensorDataset

from orchestrator_contract.jobs import JobSpec, TrainingPlan
from workers.runtime.context import LocalContext
from workers.runtime.train_loop import run_training
from workers.workloads.base import Workload

HERE = "tests.unit.harness"
MLP, BN_MLP, TRANSFORMER = f"{HERE}:mlp", f"{HERE}:bn_mlp", f"{HERE}:transformer"
REGRESSION = f"{HERE}:regression"
FEATURES, CLASSES, VOCAB, LENGTH = 8, 3, 16, 8

# The device each process-group backend trains on. A test runs on both through these params; the CUDA
# ones carry the ``gpu`` marker (tests/conftest.py skips them, saying why, where there are too few GPUs).
DEVICE_OF = {"gloo": "cpu", "nccl": "cuda"}


def devices() -> list:
    """``cpu`` and ``cuda`` (one GPU) as pytest params."""
    return ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def backends(ranks: int = 2) -> list:
    """``gloo`` (CPU) and ``nccl`` (CUDA: ``ranks`` GPUs, one per rank) as pytest params."""
    return ["gloo", pytest.param("nccl", marks=pytest.mark.gpu(ranks))]


# --- tiny workloads: build(config, seed) -------------------------------------------------------------


def _teacher_data(samples: int, offset: int) -> TensorDataset:
    """A fixed, learnable classification set: labels from a random linear teacher."""
    generator = torch.Generator().manual_seed(1234)
    teacher = torch.randn(FEATURES, CLASSES, generator=generator)
    x = torch.randn(offset + samples, FEATURES, generator=generator)[offset:]
    return TensorDataset(x, (x @ teacher).argmax(dim=1))


def _classifier(config: dict, model: nn.Module) -> Workload:
    train, val = config.get("samples", 64), config.get("val_samples", 30)
    return Workload(model=model, train_dataset=_teacher_data(train, 0), val_dataset=_teacher_data(val, train))


def mlp(config: dict, seed: int) -> Workload:
    dropout = config.get("dropout", 0.0)
    model = nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Dropout(dropout), nn.Linear(16, CLASSES))
    return _classifier(config, model)


def bn_mlp(config: dict, seed: int) -> Workload:
    model = nn.Sequential(nn.Linear(FEATURES, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, CLASSES))
    return _classifier(config, model)


class Block(nn.Module):
    def __init__(self, width: int, dropout: float) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 2 * width), nn.GELU(), nn.Dropout(dropout), nn.Linear(2 * width, width)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


class TinyTransformer(nn.Module):
    """Embedding, two residual blocks, a head: the shape FSDP shards block by block."""

    def __init__(self, dropout: float) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 16)
        self.blocks = nn.ModuleList(Block(16, dropout) for _ in range(2))
        self.head = nn.Linear(16, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _sequences(samples: int, offset: int) -> TensorDataset:
    x = torch.randint(0, VOCAB, (offset + samples, LENGTH), generator=torch.Generator().manual_seed(99))[offset:]
    return TensorDataset(x, (x * 3 + 1) % VOCAB)


def transformer(config: dict, seed: int) -> Workload:
    train = config.get("samples", 64)
    return Workload(
        model=TinyTransformer(config.get("dropout", 0.0)),
        train_dataset=_sequences(train, 0),
        val_dataset=_sequences(30, train),
        fsdp_blocks=lambda model: model.blocks,
        targets_per_sample=LENGTH,
    )


def _linear_data(samples: int, offset: int) -> TensorDataset:
    """y = x . w + noise, one target per sample."""
    generator = torch.Generator().manual_seed(4321)
    weights = torch.randn(FEATURES, 1, generator=generator)
    x = torch.randn(offset + samples, FEATURES, generator=generator)[offset:]
    return TensorDataset(x, x @ weights + 0.1 * torch.randn(samples, 1, generator=generator))


def regression(config: dict, seed: int) -> Workload:
    """A linear regression with its own metric, ``val_mae``; ``config["metric"]`` renames it (a bad name) and
    ``config["per_sample"]`` returns it unreduced (a mistake): what the loop must refuse."""
    train, val = config.get("samples", 64), config.get("val_samples", 31)
    name = config.get("metric", "val_mae")

    def metrics(output: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
        error = (output - target).abs()
        return {
            name: error if config.get("per_sample") else error.mean(),
            "val/within_0.5": (error < 0.5).double().mean(),
        }

    return Workload(
        model=nn.Linear(FEATURES, 1),
        train_dataset=_linear_data(train, 0),
        val_dataset=_linear_data(val, train),
        loss_fn=nn.functional.mse_loss,
        metrics=metrics,
    )


# --- jobs ---------------------------------------------------------------------------------------


def job_config(
    workload: str = MLP, *, workers: int = 2, strategy: str = "ddp", device: str = "cpu", **spec_fields: Any
) -> dict:
    """A loop config as the driver builds it; the plan is resolved as the control plane does. ``device="cuda"``
    is ``scaling.use_gpu``: each worker trains on its GPU."""
    spec = JobSpec(workload=workload, scaling={"num_workers": workers, "use_gpu": device == "cuda"}, **spec_fields)
    return loop_config(spec, TrainingPlan(strategy=strategy, global_batch=spec.global_batch, lr=spec.scaled_lr))


def loop_config(spec: JobSpec, plan: TrainingPlan) -> dict:
    """What the driver hands every worker for ``spec`` (a workload's or a training function's), reporting nowhere."""
    return {
        "job_id": "job-1",
        "attempt": 1,
        "control_plane_url": None,
        "token": "",
        "spec": spec.model_dump(mode="json"),
        "plan": plan.model_dump(mode="json"),
    }


class RecordingReporter:
    def __init__(self) -> None:
        self.events: list = []

    def emit(self, event) -> None:
        self.events.append(event)

    def flush(self, timeout_s: float) -> bool:
        return True

    def close(self) -> None:
        pass


def loop_device(config: dict) -> torch.device:
    """Where a worker of ``config`` trains: with ``use_gpu``, this process's GPU (``run_on_ranks`` gives each
    NCCL rank its own, as Ray Train does), else the CPU."""
    if config["spec"]["scaling"]["use_gpu"]:
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def train(config: dict, root: str | Path, resume_from: str | Path | None = None) -> dict[str, Any]:
    """One ``run_training`` in this process (a rank of the group, or alone); what it produced."""
    ctx = LocalContext(root, resume_from, loop_device(config))
    reporter = RecordingReporter()
    metrics = run_training(config, ctx, reporter)
    return {
        "metrics": metrics,
        "events": [event.model_dump() for event in reporter.events],
        "checkpoints": [str(path) for path in ctx.checkpoints],
        "reported": ctx.reported,
    }


def model_state(checkpoint: str | Path) -> dict[str, torch.Tensor]:
    return torch.load(Path(checkpoint) / "model.pt", weights_only=True, map_location="cpu")


def assert_same_state(
    a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float = 1e-6, rtol: float = 0.0
) -> None:
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], atol=atol, rtol=rtol, msg=lambda m, key=key: f"{key}: {m}")


# --- the 2-process runner ---------------------------------------------------------------------------

Task = tuple[Callable[..., Any], dict[str, Any]]


def run_on_ranks(tasks: list[Task], workdir: Path, world_size: int = 2, backend: str = "gloo") -> list[list[Any]]:
    """Run every task, in order, on each rank of a new ``backend`` group; ``results[rank][task]``. On
    ``nccl`` rank r uses GPU r (NCCL needs one GPU per rank).

    Tasks are module-level functions (the spawned ranks import them by name) with keyword arguments.
    """
    os.environ["OMP_NUM_THREADS"] = "1"  # inherited by the ranks: 2 cores, 2 ranks
    mp.start_processes(
        _rank_main, args=(world_size, backend, tasks, str(workdir)), nprocs=world_size, start_method="spawn"
    )
    results = []
    for rank in range(world_size):
        with open(workdir / f"results-{rank}.pkl", "rb") as file:
            results.append(pickle.load(file))
    return results


def _rank_main(rank: int, world_size: int, backend: str, tasks: list[Task], workdir: str) -> None:
    torch.set_num_threads(1)
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"file://{workdir}/store", rank=rank, world_size=world_size)
    try:
        results = [task(**kwargs) for task, kwargs in tasks]
    finally:
        dist.destroy_process_group()
    with open(f"{workdir}/results-{rank}.pkl", "wb") as file:
        pickle.dump(results, file)
