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


def test_the_client_contract_covers_every_package_of_the_client_distribution():
    # A package added to client/ must be held to "imports none of the service's packages" too, or the client
    # distribution would install and then fail to import without the service.
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (client,) = [c for c in contracts if c["name"].startswith("The client distribution")]
    packages = {p.parent.name for p in (REPO / "client").glob("*/__init__.py")}
    assert packages == {"orchestrator_client", "orchestrator_contract"}
    assert set(client["source_modules"]) == packages
    assert {"api", "orchestrator", "workers"} <= set(client["forbidden_modules"])
