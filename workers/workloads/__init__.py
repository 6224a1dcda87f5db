"""Workloads: the built-ins (``digits``, ``tiny_gpt``) and how the cluster loads any workload by name.

What the service knows about each workload is in ONE place, the registry ``orchestrator_contract.workloads``
(how to add a workload is told there). Importing this package imports no torch: ``Workload`` and
``flat_cross_entropy`` (``workers.workloads.base``, torch) load on first use.
The control plane has already checked that a custom workload's package is allowed; here we only resolve
the name, and say clearly what is wrong when it cannot be resolved.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from orchestrator_contract.workloads import WorkloadDescriptor, describe, get, names, register, resolve

if TYPE_CHECKING:
    from torch import nn

    from workers.workloads.base import Workload, flat_cross_entropy

BuildFn = Callable[[dict, int], "Workload"]
ModelBuilder = Callable[[dict], "nn.Module"]


def load_workload(name: str) -> BuildFn:
    """``build(config, seed) -> Workload`` of the workload ``name`` (ValueError says what is wrong with it)."""
    return resolve(name).load_build()


def load_model_builder(name: str) -> ModelBuilder:
    """How to make the workload's untrained model; without its own, the whole Workload is built (seed 0)."""
    return resolve(name).load_model_builder()


def __getattr__(attribute: str) -> Any:
    if attribute in ("Workload", "flat_cross_entropy"):  # torch: only when asked for
        from workers.workloads import base

        return getattr(base, attribute)
    raise AttributeError(f"module {__name__!r} has no attribute {attribute!r}")


__all__ = [
    "Workload",
    "WorkloadDescriptor",
    "describe",
    "flat_cross_entropy",
    "get",
    "load_model_builder",
    "load_workload",
    "names",
    "register",
    "resolve",
]
