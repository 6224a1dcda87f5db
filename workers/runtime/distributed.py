"""Data parallelism for the loop: DDP or FSDP2 wrapping, gradient-sync control, small collectives.

Wrapped by hand (not with Ray's ``prepare_model``): Ray's FSDP refuses CPU, and the same code must
run under Ray, under plain ``torchrun`` and in tests. Without a process group (one in-process
worker) the model stays as it is and every helper here is a no-op.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterable, Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

# FSDP2 is imported where a model is sharded, not here: with the DTensor machinery under it, it costs about
# a second of CPU in every new worker process, which a DDP run (and its restarts) never needs.


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def wrap_model(
    model: nn.Module,
    strategy: str,
    device: torch.device,
    fsdp_blocks: Callable[[nn.Module], Iterable[nn.Module]] | None = None,
) -> nn.Module:
    """``model`` on ``device``, wrapped in DDP or sharded in place with FSDP2 (blocks first, then the root)."""
    model = model.to(device)
    if not is_distributed():
        return model
    if strategy == "ddp":
        return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for block in fsdp_blocks(model) if fsdp_blocks else ():
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def is_fsdp(model: nn.Module) -> bool:
    """Sharded by FSDP2; a process that never imported FSDP2 has no such model."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    return fsdp is not None and isinstance(model, fsdp.FSDPModule)


def unwrap(model: nn.Module) -> nn.Module:
    """The user's module: DDP wraps it, FSDP2 shards it in place."""
    return model.module if isinstance(model, DistributedDataParallel) else model


@contextlib.contextmanager
def grad_sync(model: nn.Module, enabled: bool) -> Iterator[None]:
    """Around a micro-batch's forward and backward: with ``enabled=False`` gradients only accumulate
    locally (DDP ``no_sync``, FSDP2 ``set_requires_gradient_sync(False)``); the last micro-batch of
    an optimizer step syncs them all at once."""
    if is_fsdp(model):
        model.set_requires_gradient_sync(enabled)
        yield
    elif isinstance(model, DistributedDataParallel) and not enabled:
        with model.no_sync():
            yield
    else:
        yield


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum ``tensor`` in place over all ranks; returns it."""
    if is_distributed() and dist.get_world_size() > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor
