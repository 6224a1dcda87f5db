"""What one optimizer step needs (model, optimizer, LR schedule, grad scaler) and the step itself:
micro-batches with gradient accumulation, autocast, loss scaling, clipping."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from orchestrator_contract.jobs import JobSpec, OptimizerSpec, TrainingPlan
from workers.runtime.data import Batch
from workers.runtime.distributed import grad_sync, wrap_model
from workers.runtime.stragglers import OwnTime
from workers.runtime.sync_batchnorm import convert_sync_batchnorm
from workers.workloads.base import Workload

LOW_PRECISION = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class TrainState:
    model: nn.Module  # wrapped (DDP) or sharded (FSDP2) when there is a process group
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler  # enabled for fp16 only; a pass-through otherwise


def build_train_state(
    workload: Workload, spec: JobSpec, plan: TrainingPlan, device: torch.device, world_size: int
) -> TrainState:
    model = prepare_model(workload.model, spec, plan, device, world_size, workload.fsdp_blocks)
    # After wrapping: FSDP2's optimizer must see the sharded parameters.
    optimizer = make_optimizer(model.parameters(), spec.optimizer, plan.lr)
    return TrainState(
        model=model,
        optimizer=optimizer,
        scheduler=warmup_schedule(optimizer, spec.lr.warmup_steps),
        scaler=torch.amp.GradScaler(device.type, enabled=spec.precision == "fp16"),
    )


def prepare_model(
    model: nn.Module,
    spec: JobSpec,
    plan: TrainingPlan,
    device: torch.device,
    world_size: int,
    fsdp_blocks: Callable[[nn.Module], Iterable[nn.Module]] | None = None,
) -> nn.Module:
    """The model as the job trains it: sync BatchNorm if the spec asks, on the device, in DDP or FSDP2 as
    the plan says (the loop's workloads and a training function's ``ctx.prepare`` alike)."""
    if spec.sync_batchnorm and world_size > 1:
        model = convert_sync_batchnorm(model, device)
    return wrap_model(model, plan.strategy, device, fsdp_blocks)


def make_optimizer(params: Iterable[nn.Parameter], spec: OptimizerSpec, lr: float) -> torch.optim.Optimizer:
    if spec.name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=spec.momentum, weight_decay=spec.weight_decay)
    optimizer_class = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[spec.name]
    return optimizer_class(params, lr=lr, weight_decay=spec.weight_decay)


def warmup_schedule(optimizer: torch.optim.Optimizer, warmup_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear ramp up to the full rate: step ``i`` (from 0) runs at ``(i + 1) / warmup_steps`` of it."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: min(1.0, (i + 1) / max(warmup_steps, 1)))


def adopt_lr(state: TrainState, lr: float) -> bool:
    """Make ``lr`` the schedule's full rate after a checkpoint was loaded into ``state``, keeping where
    the schedule is (its step, hence the warmup factor). Loading restores the rate the checkpoint was
    written with; a run that resumes another's checkpoint with a new rate (PBT) must train at its own.
    Returns False (and changes nothing) when the rates already agree: an exact resume stays exact."""
    scheduler = state.scheduler
    if all(math.isclose(base, lr, rel_tol=1e-12) for base in scheduler.base_lrs):
        return False
    for group, base in zip(state.optimizer.param_groups, scheduler.base_lrs, strict=False):
        group["lr"] *= lr / base  # the same point of the warmup ramp, at the new rate
        group["initial_lr"] = lr
    scheduler.base_lrs = [lr] * len(scheduler.base_lrs)
    scheduler._last_lr = [group["lr"] for group in state.optimizer.param_groups]  # what get_last_lr() reports
    return True


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=LOW_PRECISION[precision])


def optimizer_step(
    state: TrainState,
    micro_batches: Sequence[Batch],
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    *,
    device: torch.device,
    precision: str,
    grad_clip_norm: float | None,
    own_time: OwnTime | None = None,
) -> torch.Tensor:
    """One optimizer step over ``micro_batches`` (model in train mode); returns their mean loss (on the
    device: no host sync). ``own_time`` times the forward passes (straggler detection)."""
    model, scaler = state.model, state.scaler
    count = len(micro_batches)
    total = torch.zeros((), device=device)
    for index, (x, y) in enumerate(micro_batches):
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        # Gradients are all-reduced once per step, on the last micro-batch.
        with grad_sync(model, enabled=index == count - 1):
            if own_time is not None:
                own_time.forward_begin()
            with autocast(precision, device):
                loss = loss_fn(model(x), y) / count  # the step's gradient is the mean over micro-batches
            if own_time is not None:
                own_time.forward_end()
            scaler.scale(loss).backward()
        total += loss.detach().float()
    if grad_clip_norm is not None:
        scaler.unscale_(state.optimizer)  # clip the true gradients, not the scaled ones
        nn.utils.clip_grad_norm_(model.parameters(), grad_clip_norm)
    scaler.step(state.optimizer)
    scaler.update()
    state.scheduler.step()
    state.optimizer.zero_grad(set_to_none=True)
    return total
