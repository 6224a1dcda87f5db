"""Deprecated: the public contract is the top-level package ``orchestrator_contract`` (in the
``orchestrator-client`` distribution, client/), so that the client no longer installs a ``workers`` package.

``workers.contract`` and each of its modules stay importable as the new modules themselves (the same objects,
so classes compare and pickle alike): for users' code written against the old path and for state pickled before
the move (a sweep's Ray Tune experiment names its classes by module). Importing it warns once.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
import warnings

import orchestrator_contract

warnings.warn(
    "workers.contract is deprecated: import orchestrator_contract instead (the orchestrator-client distribution)",
    DeprecationWarning,
    stacklevel=2,
)


def _alias_every_module() -> None:
    for info in pkgutil.walk_packages(orchestrator_contract.__path__, "orchestrator_contract."):
        module = importlib.import_module(info.name)
        old_name = "workers.contract" + info.name[len("orchestrator_contract") :]
        sys.modules.setdefault(old_name, module)
        if old_name.count(".") == 2:  # workers.contract.<name>: also an attribute of this package
            globals()[old_name.rsplit(".", 1)[1]] = module


_alias_every_module()
