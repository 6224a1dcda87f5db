"""A wide MLP on generated data: a model whose forward pass takes milliseconds (serving benchmark).

``"workload": "example_workloads.wide_mlp:build"`` with ``"config": {"features": 1024, "hidden": 2048}``
is a 6.3M-parameter classifier (two hidden layers, 10 classes) of ``features`` inputs; the labels come
from a fixed random linear teacher, so it learns something. ``bench/serve.py`` serves it.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

from workers.workloads.base import Workload

DEFAULTS = {"features": 1024, "hidden": 2048, "samples": 512}
CLASSES = 10


def build(config: dict, seed: int) -> Workload:
    unknown = sorted(set(config) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"wide_mlp: unknown config keys {unknown}; known: {sorted(DEFAULTS)}")
    cfg = {**DEFAULTS, **config}
    features, hidden, samples = int(cfg["features"]), int(cfg["hidden"]), int(cfg["samples"])
    if min(features, hidden) < 1 or samples < 20:
        raise ValueError("wide_mlp: needs features >= 1, hidden >= 1 and samples >= 20")
    generator = torch.Generator().manual_seed(1234)  # the same data everywhere, whatever the seed
    teacher = torch.randn(features, CLASSES, generator=generator)
    x = torch.rand(samples, features, generator=generator)
    y = ((x - 0.5) @ teacher).argmax(dim=1)
    split = samples * 4 // 5
    model = nn.Sequential(
        nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, CLASSES)
    )
    return Workload(
        model=model,
        train_dataset=TensorDataset(x[:split], y[:split]),
        val_dataset=TensorDataset(x[split:], y[split:]),
    )
