"""Committed checkpoints outside training: the model for serving, and where a checkpoint lives.

The layout and how the loop writes and resumes checkpoints is ``workers.runtime.checkpoint_io``.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import torch
from ray.train import Checkpoint
from torch import nn

from orchestrator_contract.checkpoints import shards_only_problem
from workers.runtime.checkpoint_io import MODEL_FILE, SHARDED_DIR, load
from workers.workloads import load_model_builder


def load_model_from_checkpoint(checkpoint_dir: str, workload_name: str, config: dict) -> nn.Module:
    """A fresh model of the workload with the checkpoint's weights, in eval mode: what serving loads.

    Only ``model.pt``, with ``torch.load(weights_only=True)``: tensors, never code (every checkpoint carries
    it: DDP's, and FSDP's gathered by the run at save time). A checkpoint with only FSDP shards is refused
    with how to make it servable, without opening them (DCP's ``.metadata`` is a pickle). ``checkpoint_dir``
    may be a local folder or a storage URI (``s3://...``): Ray's Checkpoint downloads a URI to a temporary
    folder and uses a local folder as it is.
    """
    model = load_model_builder(workload_name)(config)
    with Checkpoint(checkpoint_dir).as_directory() as local_dir:
        path = Path(local_dir) / MODEL_FILE
        if not path.is_file():
            if (Path(local_dir) / SHARDED_DIR).is_dir():
                raise ValueError(shards_only_problem(checkpoint_dir))
            raise FileNotFoundError(f"checkpoint {checkpoint_dir} has no {MODEL_FILE}")
        state = load_tensors(path, checkpoint_dir)
    model.load_state_dict(state)
    return model.eval()


def load_tensors(path: Path, checkpoint_dir: str) -> dict:
    """``model.pt`` as a state dict of tensors; ValueError, saying so, when it is anything else (a pickle
    that names code, say: ``weights_only`` refuses it before calling anything)."""
    try:
        state = load(path)
    except pickle.UnpicklingError as exc:
        raise ValueError(
            f"checkpoint {checkpoint_dir}: {MODEL_FILE} is not a state dict of tensors, and serving loads only "
            f"tensors (torch.load weights_only=True refused it: {_why_refused(exc)})"
        ) from None
    if not isinstance(state, dict) or not all(isinstance(value, torch.Tensor) for value in state.values()):
        raise ValueError(
            f"checkpoint {checkpoint_dir}: {MODEL_FILE} is not a state dict of tensors (it holds a "
            f"{type(state).__name__}): save model.state_dict()"
        )
    return state


def _why_refused(exc: pickle.UnpicklingError) -> str:
    """The line of torch's long weights_only message that says what it refused ("Trying to load unsupported
    GLOBAL posix.system ...", "Unsupported operand 149"), without its advice to load with weights_only=False."""
    boilerplate = ("Weights only load failed", "Please file an issue", "Check the documentation")
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    said = [line for line in lines if not line.startswith(boilerplate)]
    return (said or [type(exc).__name__])[0][:300]


def checkpoint_uri(checkpoint: Checkpoint, storage_path: str) -> str:
    """Where a committed checkpoint lives, in a form ``Checkpoint(...)`` can open again.

    Ray keeps a checkpoint's path on its filesystem without the scheme (``s3://bucket/runs`` becomes
    ``bucket/runs/...``), so the scheme of the run's storage path is put back.
    """
    scheme, separator, _ = storage_path.partition("://")
    return f"{scheme}://{checkpoint.path}" if separator else checkpoint.path
