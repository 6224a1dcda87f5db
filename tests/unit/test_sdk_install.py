"""The SDK and CLI install alone (client/pyproject.toml, the distribution ``orchestrator-client``) into a fresh
venv without Ray, PyTorch, SQLAlchemy or FastAPI, and import and run without them; the service's wheel and the
client's each hold only their own packages."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
SERVER_ONLY = ("ray", "torch", "sqlalchemy", "fastapi")


def _copy_sources(target: Path) -> Path:
    """client/ copied (a build writes its egg-info beside the packages: not into the checkout)."""
    shutil.copytree(ROOT / "client", target / "client", ignore=IGNORE)
    return target / "client"


IGNORE = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")


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

    # the contract is its own top-level package: no workers/ on a user's machine
    site = next((venv / "lib").glob("python3*/site-packages"))
    assert (site / "orchestrator_contract" / "rest").is_dir()
    assert not (site / "workers").exists()

    help_text = subprocess.run([str(venv / "bin" / "orch"), "--help"], capture_output=True, text=True)
    assert help_text.returncode == 0, help_text.stderr
    assert "jobs" in help_text.stdout


def _wheel(source: Path, out: Path) -> zipfile.ZipFile:
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(out),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = out.glob("*.whl")
    return zipfile.ZipFile(wheel)


def _top_level(wheel: zipfile.ZipFile) -> set[str]:
    return {name.split("/")[0] for name in wheel.namelist() if not name.split("/")[0].endswith(".dist-info")}


def _requires(wheel: zipfile.ZipFile) -> list[str]:
    (metadata,) = [name for name in wheel.namelist() if name.endswith(".dist-info/METADATA")]
    lines = wheel.read(metadata).decode().splitlines()
    return [line.removeprefix("Requires-Dist: ") for line in lines if line.startswith("Requires-Dist: ")]


@pytest.mark.timeout(300)
def test_each_wheel_holds_only_its_own_packages_and_the_service_depends_on_the_client(tmp_path):
    src = tmp_path / "src"
    for name in ("api", "orchestrator", "workers"):
        shutil.copytree(ROOT / name, src / name, ignore=IGNORE)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    service = _wheel(src, tmp_path / "service")
    client = _wheel(_copy_sources(tmp_path / "client-src"), tmp_path / "client")

    assert _top_level(client) == {"orchestrator_client", "orchestrator_contract"}
    assert _top_level(service) == {"api", "orchestrator", "workers"}
    # the service's workers/contract is the deprecated alias alone, never a second copy of the contract
    assert [n for n in service.namelist() if n.startswith("workers/contract/")] == ["workers/contract/__init__.py"]
    assert not [n for n in service.namelist() if "orchestrator_client" in n or "orchestrator_contract/" in n]
    # one `orch` command, the client's
    entry_points = {n: service.read(n).decode() for n in service.namelist() if n.endswith("entry_points.txt")}
    assert "orch =" not in "".join(entry_points.values())

    service_requires = _requires(service)
    assert "orchestrator-client==0.1.0" in service_requires
    # ranges, not pins: from a lower bound to an upper one, so the client installs beside users' own versions
    client_requires = [Requirement(r) for r in _requires(client) if "extra ==" not in r]
    assert client_requires
    for requirement in client_requires:
        operators = {spec.operator for spec in requirement.specifier}
        assert operators == {">=", "<"}, requirement
