"""BatchNorm over the whole global batch: every rank normalises with statistics of all ranks' samples.

On GPUs this is ``nn.SyncBatchNorm``. torch 2.13's ``nn.SyncBatchNorm`` refuses CPU tensors ("expected
input tensor to be on GPU"), so on CPU BatchNorm layers become ``CpuSyncBatchNorm``: the same maths
with autograd-aware all-reduces (gradients flow back to every rank's inputs through the shared
statistics). It keeps BatchNorm's parameter and buffer names, so checkpoints load into the plain model.
"""

from __future__ import annotations

import torch
import torch.distributed.nn.functional as dist_fn
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from workers.runtime.distributed import is_distributed


def convert_sync_batchnorm(model: nn.Module, device: torch.device) -> nn.Module:
    """``model`` with every BatchNorm layer synchronised across ranks (before wrapping it)."""
    if device.type == "cuda":
        return nn.SyncBatchNorm.convert_sync_batchnorm(model)
    return _convert_cpu(model)


def _convert_cpu(module: nn.Module) -> nn.Module:
    if isinstance(module, _BatchNorm) and not isinstance(module, CpuSyncBatchNorm):
        converted = CpuSyncBatchNorm(
            module.num_features, module.eps, module.momentum, module.affine, module.track_running_stats
        )
        if module.affine:
            converted.weight, converted.bias = module.weight, module.bias
        converted.running_mean, converted.running_var = module.running_mean, module.running_var
        converted.num_batches_tracked = module.num_batches_tracked
        converted.train(module.training)
        module = converted
    for name, child in module.named_children():
        module.add_module(name, _convert_cpu(child))
    return module


def _sum_over_ranks(tensor: torch.Tensor) -> torch.Tensor:
    return dist_fn.all_reduce(tensor) if is_distributed() else tensor


class CpuSyncBatchNorm(_BatchNorm):
    """``nn.SyncBatchNorm`` for CPU tensors: inputs of shape (N, C, ...)."""

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (N, C, ...), got {input.dim()}D")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        if not self.training and self.running_mean is not None:
            return nn.functional.batch_norm(
                input, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, self.eps
            )
        # Two passes, as BatchNorm does (mean, then the mean squared deviation): stabler than E[x^2]-E[x]^2.
        x = input.float()
        dims = [0, *range(2, x.dim())]
        shape = [1, x.size(1)] + [1] * (x.dim() - 2)
        local_count = torch.full((1,), x.numel() // x.size(1), dtype=x.dtype)
        sums = _sum_over_ranks(torch.cat([x.sum(dims), local_count]))
        count = sums[-1]
        mean = sums[:-1] / count
        centered = x - mean.view(shape)
        var = _sum_over_ranks((centered * centered).sum(dims)) / count
        out = centered * torch.rsqrt(var + self.eps).view(shape)
        if self.affine:
            out = out * self.weight.view(shape) + self.bias.view(shape)
        if self.training and self.track_running_stats:
            self._update_running_stats(mean.detach(), var.detach(), count.item())
        return out.to(input.dtype)

    @torch.no_grad()
    def _update_running_stats(self, mean: torch.Tensor, var: torch.Tensor, count: float) -> None:
        self.num_batches_tracked.add_(1)
        # momentum None means a cumulative average, as in BatchNorm.
        factor = 1.0 / self.num_batches_tracked.item() if self.momentum is None else self.momentum
        unbiased = var * (count / max(count - 1, 1))
        self.running_mean.lerp_(mean, factor)
        self.running_var.lerp_(unbiased, factor)
