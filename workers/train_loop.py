"""The one training loop, run on every Ray Train worker for every workload.

``config`` carries ``job_id``, ``attempt``, ``control_plane_url``, ``token`` and ``spec`` (a JobSpec as
a dict). Rank 0 reports a ``running`` state, metrics after every epoch and, through Ray Train,
checkpoints every ``spec.checkpoint.every_epochs`` epochs and after the last one.
"""

from __future__ import annotations

import logging
import tempfile
from typing import Any, Protocol

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, Subset

from workers.checkpoints import save_checkpoint
from workers.context import LoopContext, RayContext
from workers.reporter import EventReporter
from workers.spec import JobSpec, MetricsEvent, StateEvent
from workers.workloads import Workload, load_workload

log = logging.getLogger(__name__)

FINAL_FLUSH_TIMEOUT_S = 30.0


class Reporter(Protocol):
    def emit(self, event: Any) -> None: ...
    def flush(self, timeout_s: float) -> bool: ...
    def close(self) -> None: ...


def train_loop_per_worker(config: dict) -> None:
    """Entry point handed to ``TorchTrainer``."""
    run_training(config, RayContext())


def run_training(config: dict, ctx: LoopContext, reporter: Reporter | None = None) -> dict[str, float]:
    """Train the job's workload; returns the last epoch's metrics.

    ``reporter`` receives rank 0's events; by default rank 0 builds an ``EventReporter`` from ``config``.
    """
    spec = JobSpec.model_validate(config["spec"])
    seed = int(spec.config.get("seed", 0))
    torch.set_num_threads(max(1, int(spec.scaling.cpus_per_worker)))
    # Same seed on every rank: every rank builds the same initial model (DDP also broadcasts rank 0's).
    torch.manual_seed(seed)
    workload = load_workload(spec.workload)(spec.config)
    model = ctx.prepare_model(workload.model)
    optimizer = workload.make_optimizer(model.parameters())

    start_epoch, step = 0, 0
    state = ctx.latest_checkpoint()
    if state is not None:
        _unwrap(model).load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start_epoch, step = int(state["epoch"]), int(state["step"])
        log.info("resuming after epoch %d (step %d)", start_epoch, step)

    owns_reporter = False
    if ctx.rank != 0:
        reporter = None  # one voice per job: rank 0's
    elif reporter is None:
        reporter = EventReporter(
            config.get("control_plane_url"), config["job_id"], config["attempt"], config.get("token", "")
        )
        owns_reporter = True

    metrics: dict[str, float] = {}
    try:
        if reporter is not None:
            reporter.emit(StateEvent(state="running"))
        sampler = DistributedSampler(
            workload.train_dataset, num_replicas=ctx.world_size, rank=ctx.rank, shuffle=True, seed=seed
        )
        train_loader = DataLoader(
            workload.train_dataset, batch_size=workload.batch_size, sampler=sampler, num_workers=0
        )
        # Disjoint shards with no padding, so the all-reduced sums cover each sample exactly once.
        val_shard = Subset(workload.val_dataset, range(ctx.rank, len(workload.val_dataset), ctx.world_size))
        val_loader = DataLoader(val_shard, batch_size=workload.batch_size, shuffle=False, num_workers=0)

        for epoch in range(start_epoch + 1, workload.epochs + 1):
            sampler.set_epoch(epoch)  # a new shuffle each epoch, the same one on a resumed run
            train_sums, step = _train_epoch(model, optimizer, train_loader, workload, ctx.device, step)
            val_sums = _evaluate(_unwrap(model), val_loader, workload, ctx.device)
            sums = torch.cat([train_sums, val_sums])
            ctx.all_reduce_sum(sums)
            train_loss, train_n, val_loss, val_correct, val_n = sums.tolist()
            metrics = {
                "train_loss": train_loss / max(train_n, 1),
                "val_loss": val_loss / max(val_n, 1),
                "val_accuracy": val_correct / max(val_n, 1),
            }
            if reporter is not None:
                reporter.emit(MetricsEvent(epoch=epoch, step=step, values=metrics))
            if epoch % spec.checkpoint.every_epochs == 0 or epoch == workload.epochs:
                _commit_checkpoint(ctx, model, optimizer, epoch, step, metrics)
    finally:
        if reporter is not None:
            if not reporter.flush(FINAL_FLUSH_TIMEOUT_S):
                log.warning("not every event reached the control plane within %.0fs", FINAL_FLUSH_TIMEOUT_S)
            if owns_reporter:
                reporter.close()
    return metrics


def _train_epoch(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loader: DataLoader,
    workload: Workload,
    device: torch.device,
    step: int,
) -> tuple[torch.Tensor, int]:
    """One pass over this rank's shard; returns ``[loss sum, samples]`` and the new global step."""
    model.train()
    # Accumulated on the device: no host sync per step.
    sums = torch.zeros(2, dtype=torch.float64, device=device)
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        optimizer.zero_grad(set_to_none=True)
        loss = workload.loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        step += 1
        sums += torch.stack(
            [loss.detach().double() * len(y), torch.tensor(len(y), dtype=torch.float64, device=device)]
        )
    return sums, step


@torch.no_grad()
def _evaluate(model: nn.Module, loader: DataLoader, workload: Workload, device: torch.device) -> torch.Tensor:
    """``[loss sum, correct, samples]`` over this rank's validation shard.

    Runs the unwrapped module: shards may differ in size by one batch, and a DDP forward could
    enter a collective that the other rank never joins.
    """
    model.eval()
    sums = torch.zeros(3, dtype=torch.float64, device=device)
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        out = model(x)
        sums += torch.stack(
            [
                workload.loss_fn(out, y).double() * len(y),
                (out.argmax(dim=1) == y).sum().double(),
                torch.tensor(len(y), dtype=torch.float64, device=device),
            ]
        )
    return sums


def _commit_checkpoint(
    ctx: LoopContext,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    epoch: int,
    step: int,
    metrics: dict[str, float],
) -> None:
    # Every rank reports (Ray Train's report is a barrier); only rank 0 writes the one full copy.
    with tempfile.TemporaryDirectory(prefix="checkpoint-", ignore_cleanup_errors=True) as tmp:
        if ctx.rank == 0:
            save_checkpoint(
                tmp,
                {
                    "model": _unwrap(model).state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "epoch": epoch,
                    "step": step,
                },
            )
        ctx.report({**metrics, "epoch": epoch, "step": step}, tmp if ctx.rank == 0 else None)


def _unwrap(model: nn.Module) -> nn.Module:
    """The user's module inside a DDP wrapper (Ray does not wrap a single worker's model)."""
    return model.module if isinstance(model, DistributedDataParallel) else model
