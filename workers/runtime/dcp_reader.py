"""Reading a sharded checkpoint (``torch.distributed.checkpoint``, DCP) without running what a pickle names.

DCP writes ``.metadata`` with ``pickle`` and reads it back with ``pickle.load``: a ``.metadata`` planted in a
run's folder by other code on the cluster would run in whatever reads it. ``SafeShardReader`` reads it with
an unpickler that builds only DCP's own metadata classes (and torch sizes, dtypes and layouts), as
``torch.load(weights_only=True)`` builds only tensors; anything else is refused before it is called. The
tensors themselves come from the ``.distcp`` files through DCP's reader, which loads each one with
``weights_only=True``. The non-tensor entries (an optimizer's learning rate, betas, parameter names), which
DCP's default planner unpickles with ``weights_only=False``, are read by ``TensorsOnlyLoadPlanner`` with
``weights_only=True``; ``read_full_model`` asks only for the model's tensors and reads none of them.

Serving reads none of this (only ``model.pt``); the training runtime resumes through it, and so does the
operator's ``python -m workers.train.export_full``.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta, TensorStorageMetadata

MODEL_KEY = "model"  # the checkpoint's model, next to "optimizer" (workers.runtime.checkpoint_io)

_METADATA_MODULE = "torch.distributed.checkpoint.metadata"
_ALLOWED = {
    (_METADATA_MODULE, name)
    for name in (
        "Metadata",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "ChunkStorageMetadata",
        "TensorProperties",
        "MetadataIndex",
        "StorageMeta",
        "_MEM_FORMAT_ENCODING",
    )
} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),
    ("pathlib", "WindowsPath"),
    ("collections", "OrderedDict"),
}


class NotShardMetadata(ValueError):
    """A ``.metadata`` that names something other than DCP's metadata: refused, never called."""


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise NotShardMetadata(f"it names {module}.{name}, which is not part of DCP checkpoint metadata")


def read_metadata_safely(path: str | os.PathLike) -> Metadata:
    """A ``.metadata`` file's ``Metadata``; ``NotShardMetadata`` when it is anything else."""
    with open(path, "rb") as file:
        try:
            metadata = _MetadataUnpickler(file).load()
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as exc:
            raise NotShardMetadata(f"{path} is not DCP checkpoint metadata: {exc}") from None
    if not isinstance(metadata, Metadata):
        raise NotShardMetadata(f"{path} is not DCP checkpoint metadata: it holds a {type(metadata).__name__}")
    return metadata


class SafeShardReader(FileSystemReader):
    """DCP's file reader, with ``.metadata`` read by ``read_metadata_safely`` instead of ``pickle.load``."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        rank = kwargs.get("rank")
        metadata = read_metadata_safely(self._get_metadata_path(rank))
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class TensorsOnlyLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner, with its non-tensor entries loaded by ``torch.load(weights_only=True)``."""

    def load_bytes(self, read_item: Any, value: Any) -> None:
        loaded = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            from torch.distributed.checkpoint._traverse import set_element  # as DefaultLoadPlanner does

            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded


def read_full_model(sharded_dir: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The full (unsharded) model state dict of a sharded checkpoint, in one process (no process group).

    Its keys and shapes come from the metadata; a model entry that is not a tensor is refused, since
    reading it would mean unpickling it.
    """
    import torch.distributed.checkpoint as dcp

    reader = SafeShardReader(Path(sharded_dir))
    metadata = reader.read_metadata()
    prefix = f"{MODEL_KEY}."
    model = {}
    for fqn, entry in metadata.state_dict_metadata.items():
        if not fqn.startswith(prefix):
            continue
        if not isinstance(entry, TensorStorageMetadata):
            raise ValueError(f"{sharded_dir}: the model's entry {fqn} is not a tensor: only tensors are read")
        model[fqn.removeprefix(prefix)] = torch.empty(entry.size, dtype=entry.properties.dtype)
    if not model:
        raise ValueError(f"{sharded_dir} holds no model tensors (no '{prefix}*' entry)")
    try:
        dcp.load({MODEL_KEY: model}, storage_reader=reader, no_dist=True)
    except CheckpointException as exc:  # a BaseException: what went wrong on each rank, here the only one
        raise ValueError(f"{sharded_dir}: its shards could not be read: {_first_line(exc)}") from None
    return model


def _first_line(exc: BaseException) -> str:
    failures = getattr(exc, "failures", None) or {}
    cause = next(iter(failures.values()), (exc, None))[0]  # rank -> (exception, traceback)
    return (str(cause).strip().splitlines() or [type(cause).__name__])[0][:300]
