"""`make run` as a user runs it, then the README walkthrough pasted as written, then Ctrl-C."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]
ADMIN = "dev-admin-token"  # the token the README's walkthrough starts the service with


def readme_blocks(heading: str, language: str = "bash") -> list[str]:
    """The ``language`` blocks of the README's section ``heading``, as written."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(rf"```{language}\n(.*?)```", section, flags=re.S)


def walkthrough_blocks() -> list[str]:
    return readme_blocks("5-minute walkthrough")


def own_model_block() -> str:
    (block,) = readme_blocks("Train your own model")
    return block


CLI_SECTION = "From the command line and Python"


def cli_block() -> str:
    (block,) = readme_blocks(CLI_SECTION)
    return block


def sdk_block() -> str:
    (block,) = readme_blocks(CLI_SECTION, language="python")
    return block


def test_readme_walkthrough_is_what_the_test_runs():
    blocks = walkthrough_blocks()
    assert blocks[0].strip() == f"ORCHESTRATOR_ADMIN_TOKEN={ADMIN} make run"
    assert blocks[1].startswith("# terminal 2")
    assert own_model_block().startswith("# terminal 2, after the walkthrough")
    assert cli_block().startswith("# terminal 2, after the walkthrough")
    assert "from orchestrator_client import Client" in sdk_block()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purposes.
    status = Path(f"/proc/{pid}/status")
    return not (status.exists() and "\nState:\tZ" in status.read_text())


def _wait_until(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.5)


def test_make_run_then_the_walkthrough_then_ctrl_c(tmp_path):
    port = free_port()
    var = tmp_path / "var"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "ORCHESTRATOR_", "PYTEST"))}
    env.update(
        ORCHESTRATOR_ADMIN_TOKEN=ADMIN,
        ORCHESTRATOR_PORT=str(port),
        ORCHESTRATOR_VAR_DIR=str(var),
        ORCHESTRATOR_DATABASE_URL=f"sqlite:///{var}/orchestrator.db",
        ORCHESTRATOR_STORAGE=str(var / "storage"),
        ORCHESTRATOR_RAY_GCS_PORT=str(free_port()),
        ORCHESTRATOR_RAY_DASHBOARD_PORT=str(free_port()),
        ORCHESTRATOR_RAY_CLIENT_PORT=str(free_port()),
    )
    base = f"http://127.0.0.1:{port}"
    log = (tmp_path / "make-run.log").open("w")
    service = subprocess.Popen(
        ["make", "run"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:

        def ready() -> bool:
            assert service.poll() is None, (tmp_path / "make-run.log").read_text()[-5000:]
            try:
                answer = httpx.get(f"{base}/readyz", timeout=5)  # 200 once the database answers; Ray:
                return answer.status_code == 200 and answer.json()["ray"].startswith("ok")
            except httpx.HTTPError:
                return False

        _wait_until(ready, 300, "make run to be ready")
        head_pid = int((var / "ray" / "head.pid").read_text())

        # The walkthrough, the same from orch, then "Train your own model", in the same shell (they use the
        # walkthrough's variables). orch's profiles go to a config folder of the test's own.
        script = walkthrough_blocks()[1] + "\n" + cli_block() + "\n" + own_model_block()
        shell_env = {**env, "ORCH": base, "XDG_CONFIG_HOME": str(tmp_path / "config")}
        result = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=ROOT,
            env=shell_env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
        out = result.stdout
        job_id = re.search(r"^job ([0-9a-f]{32})$", out, flags=re.M).group(1)
        assert '"loc":["body","epochs"]' in out  # the 422 example names the field

        admin = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30)
        job = admin.get(f"/v1/jobs/{job_id}").json()
        assert job["state"] == "SUCCEEDED", job
        assert job["result"]["metrics"]["val_accuracy"] >= 0.95
        assert job["labels"] == {"team": "vision"}
        long_job = next(j for j in admin.get("/v1/jobs").json()["items"] if j["spec"]["epochs"] == 500)
        _wait_until(lambda: admin.get(f"/v1/jobs/{long_job['id']}").json()["state"] == "CANCELLED", 60, "the cancel")

        # Your own model: the example directory, uploaded, trained by its own main(ctx) on 2 workers.
        own_id = re.search(r"^own job ([0-9a-f]{32})$", out, flags=re.M).group(1)
        own = admin.get(f"/v1/jobs/{own_id}").json()
        assert own["state"] == "SUCCEEDED", own
        assert own["spec"]["entrypoint"] == "train:main" and own["spec"]["code"]["id"].startswith("sha256:")
        assert own["result"]["metrics"]["val_accuracy"] > 0.85, own["result"]

        # The same from orch: a profile file only its owner reads, the followed job SUCCEEDED (exit 0, or the
        # script had stopped), the bad spec named its field and exited 2.
        config = tmp_path / "config" / "orchestrator" / "config.toml"
        assert config.stat().st_mode & 0o777 == 0o600
        assert "bob" in out and "nlp" in out  # orch whoami
        (cli_job,) = admin.get("/v1/jobs", params={"name_prefix": "digits-cli"}).json()["items"]
        assert cli_job["state"] == "SUCCEEDED" and cli_job["spec"]["epochs"] == 3, cli_job
        assert "exit 2" in out and "epochs" in result.stderr
        assert "Reporting training result" not in out  # Ray Train's per-report chatter stays quiet

        # The Python block, with the profile orch login saved (bob's key, project nlp).
        sdk = subprocess.run(
            [str(ROOT / ".venv" / "bin" / "python"), "-c", sdk_block()],
            cwd=tmp_path,
            env={k: v for k, v in shell_env.items() if k != "ORCH"},
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert sdk.returncode == 0, f"stdout:\n{sdk.stdout}\nstderr:\n{sdk.stderr}"
        assert sdk.stdout.startswith("SUCCEEDED "), sdk.stdout
        assert "digits-sdk SUCCEEDED" in sdk.stdout and "digits-cli SUCCEEDED" in sdk.stdout
        (sdk_job,) = admin.get("/v1/jobs", params={"name_prefix": "digits-sdk"}).json()["items"]
        assert sdk_job["project_id"] == cli_job["project_id"] != job["project_id"]
    finally:
        # Ctrl-C in the terminal: SIGINT to the foreground process group.
        os.killpg(service.pid, signal.SIGINT)
        _wait_until(lambda: not _port_open(port), 90, "the API to stop")
        log.close()
    _wait_until(lambda: not _alive(head_pid), 60, "the local Ray cluster to stop")


def _port_open(port: int) -> bool:
    try:
        httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
        return True
    except httpx.HTTPError:
        return False
