"""What a workload hands to the shared training loop: its model, its data and its metric.

A workload is a function ``build(config: dict, seed: int) -> Workload``: ``config`` is the job's
``config`` (validated first for built-ins), ``seed`` the job's seed (use it for any split or shuffle of
your own). Everything about training is the loop's (``workers.runtime.train_loop``): sharding, DDP or FSDP,
precision, accumulation, the optimizer and learning-rate schedule, validation, metrics, checkpoints,
resuming. The loop reports ``train_loss`` and ``val_loss`` for every workload, and the validation metrics
of ``Workload.metrics``: by default ``val_accuracy`` (the share of targets where ``argmax(output, -1) ==
target``), right for a classifier over the last dimension of its output (digit classes, the next character
for a language model). A regression or multi-label model brings its own (``val_mae``...).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.data import Dataset


def flat_cross_entropy(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over every target, whatever the leading dimensions (batch, sequence...)."""
    return nn.functional.cross_entropy(output.reshape(-1, output.shape[-1]).float(), target.reshape(-1))


def flat_accuracy(output: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
    """The classifier's default metric: the share of targets where ``argmax(output, -1) == target``."""
    return {"val_accuracy": (output.argmax(dim=-1) == target).double().mean()}


@dataclass
class Workload:
    model: nn.Module
    # Map-style datasets whose items are ``(x, y)`` tensors; ``y`` holds class indices.
    train_dataset: Dataset
    val_dataset: Dataset
    # Must return the MEAN over all targets of the batch: the loop weighs it by the target count.
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = flat_cross_entropy
    # FSDP2 shards each of these modules on its own (then the root): a transformer's blocks. None: the
    # whole model is one unit.
    fsdp_blocks: Callable[[nn.Module], Iterable[nn.Module]] | None = None
    # Targets per sample (a sequence model's context length): throughput is reported in these too.
    targets_per_sample: int = 1
    # Validation metrics: ``{full name: MEAN over the batch's targets}``, like ``loss_fn``. The loop weighs
    # each by the batch's target count and sums over the whole validation set (every rank's shard), so an
    # epoch's value is the exact mean over the set. Names follow ``orchestrator_contract.metrics``; a spec's
    # ``metric`` or ``keep_best`` may name them. None: ``flat_accuracy`` (``val_accuracy``).
    metrics: Callable[[torch.Tensor, torch.Tensor], dict[str, torch.Tensor]] | None = None
