"""``orch login``, ``whoami`` and ``status`` against the unit-test app over real HTTP: login checks the key and
writes a 0600 profile that later commands (and whoami) read back."""

from __future__ import annotations

import json
import stat
import tomllib

import pytest

from orchestrator_client.errors import NotFound
from tests.unit.api_helpers import ADMIN, blame_node
from tests.unit.cli_support import orch
from tests.unit.sdk_helpers import sdk


@pytest.fixture(autouse=True)
def config_home(tmp_path, monkeypatch):
    home = tmp_path / "config"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home))
    for name in ("ORCHESTRATOR_URL", "ORCHESTRATOR_TOKEN", "ORCHESTRATOR_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    return home


def _bare(*args, input=None):
    """``orch`` with no --url/--token: what the config file (or the environment) says."""
    from typer.testing import CliRunner

    from orchestrator_client.cli import app

    return CliRunner().invoke(app, list(args), input=input, catch_exceptions=False)


def _member_key(live) -> str:
    project = json.loads(orch(live, "projects", "create", "vision", "-o", "json").stdout)
    key = orch(live, "keys", "create", "--project", "vision", "--role", "member", "--name", "ci", "-o", "json")
    assert key.exit_code == 0, key.output
    assert json.loads(key.stdout)["project_id"] == project["id"]
    return json.loads(key.stdout)["key"]


def test_login_asks_for_the_key_writes_a_private_profile_and_whoami_reads_it(live, config_home):
    key = _member_key(live)
    result = _bare("login", "--url", live.url, input=f"{key}\n")  # the key from the prompt
    assert result.exit_code == 0, result.output
    assert key not in result.output  # not echoed
    path = config_home / "orchestrator" / "config.toml"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    saved = tomllib.loads(path.read_text())
    assert saved["default_profile"] == "default" and saved["profiles"]["default"] == {"url": live.url, "token": key}
    assert "logged in" in result.stderr and "member" in result.stderr and "vision" in result.stderr

    who = _bare("whoami", "-o", "json")
    assert who.exit_code == 0, who.output
    body = json.loads(who.stdout)
    assert (body["role"], body["project_name"], body["key_name"], body["cluster_admin"]) == (
        "member",
        "vision",
        "ci",
        False,
    )
    assert "vision" in _bare("whoami").stdout

    # a second profile, picked by --profile; the default stays the newest login
    assert _bare("login", "--url", live.url, "--token", ADMIN, "--profile", "admin").exit_code == 0
    assert json.loads(_bare("--profile", "admin", "whoami", "-o", "json").stdout)["cluster_admin"] is True
    assert _bare("--profile", "nope", "whoami").exit_code == 2


def test_login_with_a_bad_key_writes_nothing(live, config_home):
    result = _bare("login", "--url", live.url, "--token", "wrong")
    assert result.exit_code == 2 and "401" in result.stderr
    assert not (config_home / "orchestrator" / "config.toml").exists()


def test_status_shows_readiness_resources_and_the_queue(live, tmp_path):
    spec = tmp_path / "big.yaml"
    spec.write_text("workload: digits\nname: too-big\nscaling:\n  num_workers: 2\n  cpus_per_worker: 1.5\n")
    for _ in range(2):
        assert orch(live, "jobs", "submit", "-f", str(spec)).exit_code == 0
    from tests.unit.api_helpers import tick

    tick(live.app)  # one admitted (3 of 4 CPUs), one waits
    result = orch(live, "status", "-o", "json")
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    assert body["ready"]["ready"] is True and body["cluster"]["ray"] == "ok"
    assert body["cluster"]["total"]["CPU"] == 4 and body["cluster"]["jobs"]["QUEUED"] == 1
    assert [q["name"] for q in body["cluster"]["queue"]] == ["too-big"]
    table = orch(live, "status")
    assert (
        "ready" in table.stdout and "CPU" in table.stdout and "too-big" in table.stdout and "\x1b[" not in table.stdout
    )

    live.backend.available = False  # Ray away: not ready, exit 1
    down = orch(live, "status")
    assert down.exit_code == 1 and "NOT READY" in down.stdout


def test_status_lists_the_bad_nodes_and_the_sdk_clears_one(live):
    blame_node(live.app.state.service.sessions, "fake-head", "j" * 32)
    table = orch(live, "status")
    assert "BAD NODE" in table.stdout and "fake-head" in table.stdout, table.stdout
    assert json.loads(orch(live, "status", "-o", "json").stdout)["cluster"]["bad_nodes"][0]["fault_count"] == 2

    client = sdk(live)
    client.clear_bad_node("fake-head")
    assert client.cluster().bad_nodes == [] and "BAD NODE" not in orch(live, "status").stdout
    with pytest.raises(NotFound, match="no hang or straggler to clear"):
        client.clear_bad_node("fake-head")
