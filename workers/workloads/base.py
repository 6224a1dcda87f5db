"""What a workload hands to the shared training loop.

A workload is a function ``build(config: dict) -> Workload``. It supplies the model, the data and the
optimizer; the loop (``workers.train_loop``) does everything distributed: sharding, DDP, validation,
metrics, checkpoints and resuming. Workloads are classification for now: the loop reports
``val_accuracy`` as the share of ``argmax(model(x)) == y``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.utils.data import Dataset


@dataclass
class Workload:
    model: nn.Module
    # Map-style datasets whose items are ``(x, y)`` tensors; ``y`` holds class indices.
    train_dataset: Dataset
    val_dataset: Dataset
    epochs: int
    batch_size: int  # per worker: the effective batch is batch_size x workers
    make_optimizer: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]
    # Must return the MEAN over the batch: the loop multiplies by the batch size to sum exactly.
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = field(
        default_factory=nn.CrossEntropyLoss
    )
