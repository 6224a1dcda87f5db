"""Seeding, and the random-number state of one process as plain tensors and lists.

A checkpoint holds every rank's state so that a resumed run draws the same dropout masks (and
anything else random) as a run that never stopped. Plain data only: it loads with ``weights_only``.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # seeds every CUDA device too


def rank_seed(seed: int, rank: int) -> int:
    """A well-mixed 32-bit seed per (job seed, rank): ranks draw different dropout masks."""
    return int(np.random.SeedSequence([seed, rank]).generate_state(1)[0])


def capture_rng() -> dict[str, Any]:
    _, keys, position, has_gauss, cached_gaussian = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": {
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "position": int(position),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached_gaussian),
        },
        "python": {
            "version": version,
            "internal": torch.tensor(internal, dtype=torch.int64),
            "gauss_next": gauss_next,
        },
    }


def restore_rng(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    numpy_state = state["numpy"]
    np.random.set_state(
        (
            "MT19937",
            numpy_state["keys"].numpy().astype(np.uint32),
            numpy_state["position"],
            numpy_state["has_gauss"],
            numpy_state["cached_gaussian"],
        )
    )
    python_state = state["python"]
    random.setstate((python_state["version"], tuple(python_state["internal"].tolist()), python_state["gauss_next"]))
