"""Committed checkpoints outside training: the model for serving, and where a checkpoint lives.

The layout and how the loop writes and resumes checkpoints is ``workers.runtime.checkpoint_io``.
"""

from __future__ import annotations

from pathlib import Path

from ray.train import Checkpoint
from torch import nn

from workers.runtime.checkpoint_io import MODEL_FILE, SHARDED_DIR, load
from workers.workloads import load_model_builder


def load_model_from_checkpoint(checkpoint_dir: str, workload_name: str, config: dict) -> nn.Module:
    """A fresh model of the workload with the checkpoint's weights, in eval mode.

    Works for DDP checkpoints and FSDP ones written with ``checkpoint.export_full``. ``checkpoint_dir``
    may be a local folder or a storage URI (``s3://...``): Ray's Checkpoint downloads a URI to a
    temporary folder and uses a local folder as it is.
    """
    model = load_model_builder(workload_name)(config)
    with Checkpoint(checkpoint_dir).as_directory() as local_dir:
        path = Path(local_dir) / MODEL_FILE
        if not path.exists():
            if (Path(local_dir) / SHARDED_DIR).is_dir():
                raise ValueError(
                    f"checkpoint {checkpoint_dir} holds only FSDP shards, no full model: run FSDP jobs that are "
                    "to be served with checkpoint.export_full: true (or convert the shards with "
                    "torch.distributed.checkpoint.format_utils.dcp_to_torch_save)"
                )
            raise FileNotFoundError(f"checkpoint {checkpoint_dir} has no {MODEL_FILE}")
        state = load(path)
    model.load_state_dict(state)
    return model.eval()


def checkpoint_uri(checkpoint: Checkpoint, storage_path: str) -> str:
    """Where a committed checkpoint lives, in a form ``Checkpoint(...)`` can open again.

    Ray keeps a checkpoint's path on its filesystem without the scheme (``s3://bucket/runs`` becomes
    ``bucket/runs/...``), so the scheme of the run's storage path is put back.
    """
    scheme, separator, _ = storage_path.partition("://")
    return f"{scheme}://{checkpoint.path}" if separator else checkpoint.path
