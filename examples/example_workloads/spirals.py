"""Two spirals: a 2-class toy data set generated from the seed (nothing is downloaded), and an MLP.

Submit it as ``"workload": "example_workloads.spirals:build"`` with, for example,
``"config": {"points": 2000, "hidden": 64, "noise": 0.1}``.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.utils.data import TensorDataset

# ``workers`` is the service's own package: it is installed wherever a workload runs.
from workers.workloads.base import Workload

DEFAULTS = {"points": 2000, "hidden": 64, "noise": 0.1}
VAL_FRACTION = 0.2


def _parse(config: dict) -> tuple[int, int, float]:
    # The service checks the config of built-in workloads only: a custom one checks its own.
    unknown = sorted(set(config) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"spirals: unknown config keys {unknown}; known: {sorted(DEFAULTS)}")
    cfg = {**DEFAULTS, **config}
    points, hidden, noise = int(cfg["points"]), int(cfg["hidden"]), float(cfg["noise"])
    if points < 10 or hidden < 1 or noise < 0:
        raise ValueError("spirals: needs points >= 10, hidden >= 1 and noise >= 0")
    return points, hidden, noise


def make_spirals(points: int, noise: float, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``points`` 2-D points on two interleaved spirals (radius up to 1), labels 0 and 1 alternating."""
    labels = torch.arange(points) % 2
    turn = torch.sqrt(torch.rand(points, generator=generator)) * 3 * math.pi  # denser near the centre
    radius = turn / (3 * math.pi)
    angle = turn + math.pi * labels  # the second spiral is the first turned half a circle
    x = torch.stack([radius * torch.cos(angle), radius * torch.sin(angle)], dim=1)
    return x + noise * torch.randn(points, 2, generator=generator), labels


def build(config: dict, seed: int) -> Workload:
    points, hidden, noise = _parse(config)
    generator = torch.Generator().manual_seed(seed)  # the same data on every rank and every attempt
    x, y = make_spirals(points, noise, generator)
    order = torch.randperm(points, generator=generator)
    n_val = max(1, int(points * VAL_FRACTION))
    val, train = order[:n_val], order[n_val:]

    # Weights come from torch's global RNG, which the training loop seeds from the job's seed.
    model = nn.Sequential(nn.Linear(2, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 2))
    return Workload(
        model=model,
        train_dataset=TensorDataset(x[train], y[train]),
        val_dataset=TensorDataset(x[val], y[val]),
    )
