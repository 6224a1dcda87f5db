"""The public contract (``orchestrator_contract``) is importable by clients and cluster nodes that have neither the
control plane's database layer nor Ray, PyTorch or FastAPI: every module of it, in a fresh interpreter."""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import orchestrator_contract

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = ("sqlalchemy", "ray", "torch", "fastapi")


def contract_modules() -> list[str]:
    return ["orchestrator_contract"] + [
        info.name for info in pkgutil.walk_packages(orchestrator_contract.__path__, prefix="orchestrator_contract.")
    ]


def test_every_contract_module_imports_without_sqlalchemy_ray_torch_or_fastapi():
    modules = contract_modules()
    assert {"orchestrator_contract.jobs", "orchestrator_contract.rest", "orchestrator_contract.rest.errors"} <= set(
        modules
    )
    probe = (
        "import importlib, json, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        f"print(json.dumps(sorted(m for m in {FORBIDDEN!r} if m in sys.modules)))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


def test_the_rest_models_keep_their_openapi_component_names():
    from orchestrator_contract import rest

    for name in rest.__all__:
        assert getattr(rest, name).__name__ == name
