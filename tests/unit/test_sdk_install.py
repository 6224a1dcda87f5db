"""The SDK and CLI install alone (client/pyproject.toml, the distribution ``orchestrator-client``) into a fresh
venv without Ray, PyTorch, SQLAlchemy or FastAPI, and import and run without them."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVER_ONLY = ("ray", "torch", "sqlalchemy", "fastapi")


def _copy_sources(target: Path) -> Path:
    """What client/pyproject.toml builds from, copied (the build writes its egg-info beside the packages:
    not into the checkout)."""
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
    shutil.copytree(ROOT / "client", target / "client", ignore=ignore)
    shutil.copytree(ROOT / "orchestrator_client", target / "orchestrator_client", ignore=ignore)
    (target / "workers").mkdir()
    shutil.copy(ROOT / "workers" / "__init__.py", target / "workers" / "__init__.py")
    shutil.copytree(ROOT / "workers" / "contract", target / "workers" / "contract", ignore=ignore)
    return target / "client"


@pytest.mark.timeout(180)
def test_the_client_installs_alone_without_the_servers_dependencies(tmp_path):
    client_dir = _copy_sources(tmp_path / "src")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "-c", str(ROOT / "constraints.txt"), str(client_dir)],
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert install.returncode == 0, install.stdout + install.stderr

    listed = subprocess.run(
        [str(python), "-m", "pip", "list", "--format=json"], capture_output=True, text=True, check=True
    )
    installed = {package["name"].lower() for package in json.loads(listed.stdout)}
    assert "orchestrator-client" in installed and {"httpx", "pydantic", "typer"} <= installed
    assert not installed & set(SERVER_ONLY), installed & set(SERVER_ONLY)

    probe = (
        "import json, sys, orchestrator_client; orchestrator_client.Client; orchestrator_client.Job; "
        "import orchestrator_client.cli; "
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {SERVER_ONLY!r} + ('api', 'orchestrator'))))"
    )
    imported = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, cwd=tmp_path)
    assert imported.returncode == 0, imported.stderr
    assert json.loads(imported.stdout) == []

    # only the contract of workers/ comes with it, never the runtime, training or serving code
    site = next((venv / "lib").glob("python3*/site-packages"))
    assert sorted(p.name for p in (site / "workers").iterdir() if p.name != "__pycache__") == [
        "__init__.py",
        "contract",
    ]

    help_text = subprocess.run([str(venv / "bin" / "orch"), "--help"], capture_output=True, text=True)
    assert help_text.returncode == 0, help_text.stderr
    assert "jobs" in help_text.stdout
