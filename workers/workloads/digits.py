"""Built-in ``digits`` workload: scikit-learn's bundled 8x8 digits (1,797 images, no download)."""

from __future__ import annotations

import importlib.metadata
import os
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import TensorDataset

from orchestrator_contract.workloads import DigitsConfig
from workers.serve.predictors import MAX_ROWS, RowsPredictor
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
    x_train, x_val, y_train, y_val = split(seed, cfg.val_fraction)
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


def split(seed: int, val_fraction: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_train, x_val, y_train, y_val): stratified and seeded, so every rank and attempt sees the same split.

    Kept in a file per machine after the first time: importing scikit-learn costs about a second of CPU in
    every new worker process, and a worker group restarting after a failure waits for its slowest worker.
    """
    version = importlib.metadata.version("scikit-learn")  # a new version may split differently
    cache = Path(tempfile.gettempdir()) / "orchestrator-cache" / f"digits-{version}-{seed}-{val_fraction!r}.npz"
    try:
        with np.load(cache) as arrays:
            return arrays["x_train"], arrays["x_val"], arrays["y_train"], arrays["y_val"]
    except (OSError, KeyError, ValueError):  # not there yet (or cut short: written again below)
        pass
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    features, labels = load_digits(return_X_y=True)
    x_train, x_val, y_train, y_val = train_test_split(
        features, labels, test_size=val_fraction, random_state=seed, stratify=labels
    )
    try:  # to a private name first, then renamed: a reader never sees half a file
        cache.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=cache.parent, suffix=".npz", delete=False) as partial:
            np.savez(partial, x_train=x_train, x_val=x_val, y_train=y_train, y_val=y_val)
        os.replace(partial.name, cache)
    except OSError:  # a read-only or full disk only costs the next process the import
        pass
    return x_train, x_val, y_train, y_val


# --- serving ------------------------------------------------------------------------------------------


class DigitsPredictor(RowsPredictor):
    """What a deployment of ``digits`` answers (the descriptor's ``predictor``). The pixels are on the data set's own scale (scikit-learn's 8x8 digits, 0-16); the model holds the
    training split's standardization (``workers.workloads.digits.Standardize``), so the workload's own
    preprocessing is applied by the model itself."""

    features, low, high = 64, 0.0, 16.0
    unit = "pixel values (8x8)"
    expected = {"inputs": f"a list of 1 to {MAX_ROWS} rows, each 64 numbers from 0 to 16 (an 8x8 image, row by row)"}
