"""Workload registry: built-in names, or ``"package.module:function"`` from an installed package.

The control plane has already checked that a custom workload's package is allowed; here we only
resolve the name, and say clearly what is wrong when it cannot be resolved.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from torch import nn

from workers.spec import is_custom_workload
from workers.workloads import digits
from workers.workloads.base import Workload

BUILTIN: dict[str, Callable[[dict], Workload]] = {"digits": digits.build}
# Built-ins that can make their bare model without loading any data (serving, checkpoint loading).
BUILTIN_MODELS: dict[str, Callable[[dict], nn.Module]] = {"digits": digits.build_model}


def load_workload(name: str) -> Callable[[dict], Workload]:
    if name in BUILTIN:
        return BUILTIN[name]
    if not is_custom_workload(name):
        raise ValueError(
            f"malformed workload name {name!r}: expected one of {sorted(BUILTIN)} "
            'or "package.module:function"'
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


def load_model_builder(name: str) -> Callable[[dict], nn.Module]:
    """How to make the workload's untrained model; custom workloads build their whole Workload."""
    if name in BUILTIN_MODELS:
        return BUILTIN_MODELS[name]
    build = load_workload(name)
    return lambda config: build(config).model


__all__ = ["Workload", "load_model_builder", "load_workload"]
