"""The layering of docs/architecture.md holds: the import-linter contracts in pyproject.toml are kept.

`make test` runs `lint-imports` first (make lint); this runs it inside the unit suite too, so that
`pytest tests/unit` alone also fails on an import that crosses a layer (it takes under a second).
"""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys
import tomllib

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_the_import_contracts_are_kept():
    lint_imports = pathlib.Path(sys.executable).with_name("lint-imports")
    command = str(lint_imports) if lint_imports.exists() else shutil.which("lint-imports")
    assert command, "lint-imports is not installed: pip install -e '.[dev]' -c constraints.txt"
    result = subprocess.run(
        [command, "--no-cache", "--config", str(REPO / "pyproject.toml")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]


def test_the_contract_on_workers_names_every_subpackage_but_the_wire_contract():
    # import-linter cannot say "all of workers/ but workers.contract": a new subpackage is listed by hand.
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (only_contract,) = [c for c in contracts if c["name"].startswith("api and orchestrator import only")]
    subpackages = {f"workers.{p.parent.name}" for p in (REPO / "workers").glob("*/__init__.py")}
    assert set(only_contract["forbidden_modules"]) == subpackages - {"workers.contract"}
