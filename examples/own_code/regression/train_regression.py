"""A regression workload in uploaded code: no Ray node has it installed; the job's `code` brings it.

y = x . w + noise on data generated from the job's seed (nothing is downloaded), an MLP, mean squared error
as the loss and its own validation metric, `val_mae` (mean absolute error), instead of the classifier's
`val_accuracy`. Submit it as ``"workload": "train_regression:build"`` with the uploaded package's id in
``"code"``; ``config`` keys: `samples` (default 1200), `features` (8), `hidden` (32), `noise` (0.1).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

# The service's own package: installed wherever a workload runs.
from workers.workloads.base import Workload

DEFAULTS = {"samples": 1200, "features": 8, "hidden": 32, "noise": 0.1}
VAL_FRACTION = 0.2


def _parse(config: dict) -> tuple[int, int, int, float]:
    # The service checks the config of built-in workloads only: uploaded code checks its own.
    unknown = sorted(set(config) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"train_regression: unknown config keys {unknown}; known: {sorted(DEFAULTS)}")
    cfg = {**DEFAULTS, **config}
    samples, features, hidden, noise = int(cfg["samples"]), int(cfg["features"]), int(cfg["hidden"]), cfg["noise"]
    if samples < 10 or features < 1 or hidden < 1 or noise < 0:
        raise ValueError("train_regression: needs samples >= 10, features >= 1, hidden >= 1 and noise >= 0")
    return samples, features, hidden, float(noise)


def metrics(output: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
    """Each value the MEAN over the batch's targets: the loop weighs it by their count and sums over the
    whole validation set (all workers), so the epoch's value is the exact mean."""
    return {"val_mae": (output.float() - target).abs().mean()}


def build(config: dict, seed: int) -> Workload:
    samples, features, hidden, noise = _parse(config)
    generator = torch.Generator().manual_seed(seed)  # the same data on every worker and every attempt
    weights = torch.randn(features, 1, generator=generator)
    x = torch.randn(samples, features, generator=generator)
    y = x @ weights + noise * torch.randn(samples, 1, generator=generator)
    order = torch.randperm(samples, generator=generator)
    n_val = max(1, int(samples * VAL_FRACTION))
    val, train = order[:n_val], order[n_val:]

    # The model's shape depends on config only (a checkpoint is loaded into build(config, 0).model); its
    # weights come from torch's global RNG, which the training loop seeds from the job's seed.
    model = nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, 1))
    return Workload(
        model=model,
        train_dataset=TensorDataset(x[train], y[train]),
        val_dataset=TensorDataset(x[val], y[val]),
        loss_fn=nn.functional.mse_loss,
        metrics=metrics,
    )
