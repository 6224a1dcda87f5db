"""Where a Client's url and key come from (arguments, environment, profiles of the config file) and the file
``orch login`` writes: mode 0600 in a folder of mode 0700, profiles kept side by side."""

from __future__ import annotations

import os
import stat
import tomllib

import pytest

from orchestrator_client import Client, ConfigError
from orchestrator_client.config import DEFAULT_URL, config_path, load_config, save_profile


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path):
    """No real environment or config file leaks in: the config lives under tmp_path."""
    for name in ("ORCHESTRATOR_URL", "ORCHESTRATOR_TOKEN", "ORCHESTRATOR_PROFILE", "ORCHESTRATOR_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))


def test_the_file_is_private_and_keeps_every_profile(tmp_path):
    path = save_profile("dev", "http://dev:8000", "dev-key")
    assert path == tmp_path / "xdg" / "orchestrator" / "config.toml" == config_path()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    save_profile("prod", "https://prod/", "prod-key", make_default=False)
    config = load_config()
    assert config.default_profile == "dev" and set(config.profiles) == {"dev", "prod"}
    save_profile("prod", "https://prod/", "new-key")  # replaced, and now the default
    data = tomllib.loads(path.read_text())
    assert data["default_profile"] == "prod" and data["profiles"]["prod"]["token"] == "new-key"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert [p.name for p in path.parent.iterdir()] == ["config.toml"]  # no temporary file left behind


def test_resolution_order_arguments_then_environment_then_profile_then_default(monkeypatch):
    assert (Client().url, Client().token, Client().profile) == (DEFAULT_URL, None, None)
    save_profile("dev", "http://dev:8000", "dev-key")
    save_profile("prod", "http://prod:8000", "prod-key", make_default=False)
    client = Client()
    assert (client.url, client.token, client.profile) == ("http://dev:8000", "dev-key", "dev")
    assert (Client(profile="prod").url, Client(profile="prod").token) == ("http://prod:8000", "prod-key")
    monkeypatch.setenv("ORCHESTRATOR_PROFILE", "prod")
    assert Client().token == "prod-key"
    monkeypatch.setenv("ORCHESTRATOR_TOKEN", "env-key")
    assert (Client().url, Client().token) == ("http://prod:8000", "env-key")
    monkeypatch.setenv("ORCHESTRATOR_URL", "http://env:9000/")
    assert (Client().url, Client().token) == ("http://env:9000", "env-key")
    assert (Client(url="http://arg:1", token="arg-key").url, Client(url="http://arg:1", token="arg-key").token) == (
        "http://arg:1",
        "arg-key",
    )
    with pytest.raises(ConfigError, match="no profile 'nope'.*dev, prod"):
        Client(profile="nope")


def test_a_profiles_key_is_never_sent_to_another_url():
    save_profile("dev", "http://dev:8000", "dev-key")
    assert Client(url="http://elsewhere:8000").token is None
    assert Client(url="http://dev:8000/").token == "dev-key"


def test_a_broken_file_says_where(tmp_path):
    path = config_path()
    path.parent.mkdir(parents=True)
    path.write_text("this is [not toml")
    with pytest.raises(ConfigError, match=str(path)):
        Client()


def test_a_url_without_its_scheme_is_refused():
    with pytest.raises(ConfigError, match="http:// or https://"):
        Client(url="127.0.0.1:8000")
