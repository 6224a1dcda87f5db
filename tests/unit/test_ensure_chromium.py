"""scripts/ensure-chromium.sh on a PATH without Chromium: under CI (CI=true) it fails the run, elsewhere it says
the browser tests will be skipped and lets the run go on.

Proved on the old script (at 469a44c): with no chromium and no apt-get on PATH and CI=true it exited 0
(``assert 0 == 1``), so a CI run passed with the five browser tests skipped."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "ensure-chromium.sh"
BASH = shutil.which("bash")


def bare_path(tmp_path: Path, **programs: str) -> str:
    """A PATH of one folder: ``id`` (all the script runs besides bash's builtins, and apt-get) and the given
    programs, each a shell script of that text."""
    folder = tmp_path / "bin"
    folder.mkdir(parents=True)
    (folder / "id").symlink_to(shutil.which("id"))
    for name, text in programs.items():
        program = folder / name
        program.write_text(f"#!/bin/sh\n{text}\n")
        program.chmod(0o755)
    return str(folder)


def run(path: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [BASH, str(SCRIPT)], env={"PATH": path, **env}, capture_output=True, text=True, timeout=60, check=False
    )


@pytest.mark.parametrize("ci", ["true", "1"])
def test_under_ci_no_chromium_fails_the_run_and_says_why(tmp_path, ci):
    answer = run(bare_path(tmp_path), CI=ci)
    assert answer.returncode == 1, answer.stderr
    assert "no chromium found" in answer.stderr and "CI=true, so this fails the run" in answer.stderr


def test_without_ci_no_chromium_is_said_and_the_run_goes_on(tmp_path):
    answer = run(bare_path(tmp_path))
    assert answer.returncode == 0
    assert "no chromium found" in answer.stderr and "the browser tests will be skipped" in answer.stderr
    assert run(bare_path(tmp_path / "other"), CI="false").returncode == 0


def test_under_ci_a_failed_or_empty_install_fails_the_run(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("the script runs apt-get as root only; this user is not root")  # CI runs as root
    failing = run(bare_path(tmp_path / "a", **{"apt-get": "exit 100"}), CI="true")
    assert failing.returncode == 1 and "apt-get install chromium failed" in failing.stderr
    empty = run(bare_path(tmp_path / "b", **{"apt-get": "exit 0"}), CI="true")  # "installed", nothing on PATH
    assert empty.returncode == 1 and "succeeded but no chromium" in empty.stderr


def test_a_chromium_on_path_or_named_is_enough_even_under_ci(tmp_path):
    assert run(bare_path(tmp_path / "a", chromium="exit 0"), CI="true").returncode == 0
    binary = tmp_path / "chrome"
    binary.write_text("")
    named = run(bare_path(tmp_path / "b"), CI="true", ORCHESTRATOR_CHROMIUM=str(binary))
    assert named.returncode == 0 and named.stderr == ""
    gone = run(bare_path(tmp_path / "c"), CI="true", ORCHESTRATOR_CHROMIUM=str(tmp_path / "nothing"))
    assert gone.returncode == 1 and "is no file" in gone.stderr
