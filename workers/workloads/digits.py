"""Built-in ``digits`` workload: scikit-learn's bundled 8x8 digits (1,797 images, no download)."""

from __future__ import annotations

import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn
from torch.utils.data import TensorDataset

from workers.spec import DigitsConfig
from workers.workloads.base import Workload

NUM_FEATURES = 64
NUM_CLASSES = 10


class Standardize(nn.Module):
    """Fixed feature scaling kept inside the model, so a checkpoint serves raw pixels on its own."""

    def __init__(self, num_features: int) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(num_features))
        self.register_buffer("scale", torch.ones(num_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.scale


def build_model(config: dict) -> nn.Module:
    """The untrained network (standardization left at identity until ``build`` fits it)."""
    cfg = DigitsConfig.model_validate(config)
    hidden: list[nn.Module] = [nn.Linear(NUM_FEATURES, cfg.hidden)]
    if cfg.batchnorm:
        hidden.append(nn.BatchNorm1d(cfg.hidden))
    return nn.Sequential(
        Standardize(NUM_FEATURES),
        *hidden,
        nn.ReLU(),
        nn.Linear(cfg.hidden, NUM_CLASSES),
    )


def build(config: dict, seed: int) -> Workload:
    cfg = DigitsConfig.model_validate(config)
    features, labels = load_digits(return_X_y=True)
    # Stratified and seeded: every rank and every attempt sees the same split.
    x_train, x_val, y_train, y_val = train_test_split(
        features, labels, test_size=cfg.val_fraction, random_state=seed, stratify=labels
    )
    x_train = torch.tensor(x_train, dtype=torch.float32)
    x_val = torch.tensor(x_val, dtype=torch.float32)

    model = build_model(config)
    # Fit on the train split only; constant pixels (std 0) keep scale 1 instead of dividing by 0.
    std = x_train.std(dim=0, unbiased=False)
    model[0].mean.copy_(x_train.mean(dim=0))
    model[0].scale.copy_(torch.where(std > 0, std, torch.ones_like(std)))

    return Workload(
        model=model,
        train_dataset=TensorDataset(x_train, torch.tensor(y_train, dtype=torch.long)),
        val_dataset=TensorDataset(x_val, torch.tensor(y_val, dtype=torch.long)),
    )
