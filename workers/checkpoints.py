"""The one checkpoint format: ``<dir>/checkpoint.pt``, a torch.save of plain tensors and numbers.

Only plain data goes in, so loading can use ``weights_only=True``: opening a checkpoint never runs code.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from ray.train import Checkpoint
from torch import nn

from workers.workloads import load_model_builder

CHECKPOINT_FILE = "checkpoint.pt"


def save_checkpoint(directory: str | os.PathLike, state: dict[str, Any]) -> Path:
    path = Path(directory) / CHECKPOINT_FILE
    torch.save(state, path)
    return path


def load_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """``path`` is a checkpoint folder or the ``checkpoint.pt`` inside one, on local disk."""
    path = Path(path)
    if path.is_dir():
        path = path / CHECKPOINT_FILE
    return torch.load(path, weights_only=True, map_location="cpu")


def load_model_from_checkpoint(checkpoint_dir: str, workload_name: str, config: dict) -> nn.Module:
    """A fresh model of the workload with the checkpoint's weights, in eval mode.

    ``checkpoint_dir`` may be a local folder or a storage URI (``s3://...``): Ray's Checkpoint
    downloads a URI to a temporary folder and uses a local folder as it is.
    """
    model = load_model_builder(workload_name)(config)
    with Checkpoint(checkpoint_dir).as_directory() as local_dir:
        state = load_checkpoint(local_dir)
    model.load_state_dict(state["model"])
    return model.eval()


def checkpoint_uri(checkpoint: Checkpoint, storage_path: str) -> str:
    """Where a committed checkpoint lives, in a form ``Checkpoint(...)`` can open again.

    Ray keeps a checkpoint's path on its filesystem without the scheme (``s3://bucket/runs`` becomes
    ``bucket/runs/...``), so the scheme of the run's storage path is put back.
    """
    scheme, separator, _ = storage_path.partition("://")
    return f"{scheme}://{checkpoint.path}" if separator else checkpoint.path
