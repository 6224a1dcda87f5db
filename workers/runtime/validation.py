"""A workload's validation metrics as the loop sums them: checked names in one order, values weighed by the
batch's target count (``Workload.metrics`` returns means), so that one all-reduce of the sums gives the exact
mean over the whole validation set, whatever the number of ranks."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from orchestrator_contract.metrics import DEFAULT_MAX_METRIC_NAMES, check_metric_name

# What the loop reports itself, next to a workload's metrics: a workload metric may not take these names.
LOOP_NAMES = frozenset({"train_loss", "val_loss", "lr", "samples_per_s", "tokens_per_s", "epoch", "step"})
# Half the control plane's default cap on a run's distinct names: room for the loop's own.
MAX_WORKLOAD_METRICS = DEFAULT_MAX_METRIC_NAMES // 2


def metric_names(values: Mapping[Any, Any]) -> list[str]:
    """The names of one batch's metrics in the order every rank sums them (sorted: a dict's order is the
    workload's); ValueError saying what to fix for a bad name."""
    if not isinstance(values, Mapping):
        raise ValueError(f"Workload.metrics returned {type(values).__name__}: return a dict of name -> mean")
    for name in values:
        check_metric_name(name)
        if name in LOOP_NAMES:
            raise ValueError(f"Workload.metrics: {name!r} is a name the loop reports itself: {sorted(LOOP_NAMES)}")
    if len(values) > MAX_WORKLOAD_METRICS:
        raise ValueError(f"Workload.metrics returned {len(values)} metrics: at most {MAX_WORKLOAD_METRICS}")
    return sorted(values)


def weighted_sums(values: Mapping[str, Any], names: list[str], weight: int, device: torch.device) -> torch.Tensor:
    """``values[name] * weight`` for each of ``names``, as float64 on ``device``."""
    if sorted(values) != names:
        raise ValueError(
            f"Workload.metrics returned {sorted(values)} for one batch and {names} for another: "
            "return the same names for every batch"
        )
    sums = []
    for name in names:
        value = torch.as_tensor(values[name], device=device).detach()
        if value.numel() != 1:
            raise ValueError(
                f"Workload.metrics: {name!r} has shape {tuple(value.shape)}: return one number, the mean over "
                "the batch's targets"
            )
        sums.append(value.reshape(()).double() * weight)
    return torch.stack(sums) if sums else torch.zeros(0, dtype=torch.float64, device=device)
