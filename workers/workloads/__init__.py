"""Workload registry: built-in names, or ``"package.module:function"`` from an installed package.

A workload is ``build(config: dict, seed: int) -> Workload`` (see ``workers.workloads.base``). The
control plane has already checked that a custom workload's package is allowed; here we only resolve
the name, and say clearly what is wrong when it cannot be resolved.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from torch import nn

from workers.contract.jobs import is_custom_workload
from workers.workloads import digits, tiny_gpt
from workers.workloads.base import Workload, flat_cross_entropy

BuildFn = Callable[[dict, int], Workload]
ModelBuilder = Callable[[dict], nn.Module]

BUILTIN: dict[str, BuildFn] = {"digits": digits.build, "tiny_gpt": tiny_gpt.build}
# Built-ins that can make their bare model without loading any data (serving, checkpoint loading).
BUILTIN_MODELS: dict[str, ModelBuilder] = {"digits": digits.build_model, "tiny_gpt": tiny_gpt.build_model}


def load_workload(name: str) -> BuildFn:
    if name in BUILTIN:
        return BUILTIN[name]
    if not is_custom_workload(name):
        raise ValueError(
            f'malformed workload name {name!r}: expected one of {sorted(BUILTIN)} or "package.module:function"'
        )
    module_name, attribute = name.split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is None or not (module_name + ".").startswith(exc.name + "."):
            raise  # the module exists but one of ITS imports is missing: show that as it is
        raise ValueError(f"workload {name!r}: module {module_name!r} is not installed") from exc
    build = getattr(module, attribute, None)
    if not callable(build):
        raise ValueError(f"workload {name!r}: {module_name!r} has no function {attribute!r}")
    return build


def load_model_builder(name: str) -> ModelBuilder:
    """How to make the workload's untrained model; custom workloads build their whole Workload (seed 0)."""
    if name in BUILTIN_MODELS:
        return BUILTIN_MODELS[name]
    build = load_workload(name)
    return lambda config: build(config, 0).model


__all__ = [
    "BUILTIN",
    "BUILTIN_MODELS",
    "Workload",
    "flat_cross_entropy",
    "load_model_builder",
    "load_workload",
]
