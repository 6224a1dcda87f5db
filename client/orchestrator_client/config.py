"""Where the client's url and key come from: arguments, else the environment, else a profile of the config file
(``~/.config/orchestrator/config.toml``, ``$XDG_CONFIG_HOME`` honoured) that ``orch login`` writes.

The file holds keys, so it is written mode 0600 in a folder of mode 0700, atomically (a crash mid-write
never leaves half a file). Its shape::

    default_profile = "prod"

    [profiles.prod]
    url = "https://orchestrator.example.com"
    token = "..."
"""

from __future__ import annotations

import os
import tempfile
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import tomli_w

DEFAULT_URL = "http://127.0.0.1:8000"
DEFAULT_PROFILE = "default"
URL_ENV = "ORCHESTRATOR_URL"
TOKEN_ENV = "ORCHESTRATOR_TOKEN"
PROFILE_ENV = "ORCHESTRATOR_PROFILE"
CONFIG_ENV = "ORCHESTRATOR_CONFIG"  # another file than the default (tests, several setups side by side)


class ConfigError(ValueError):
    """The config file cannot be read, or names a profile it does not have."""


@dataclass(frozen=True)
class Profile:
    name: str
    url: str | None = None
    token: str | None = None


@dataclass(frozen=True)
class Config:
    default_profile: str | None = None
    profiles: dict[str, Profile] = field(default_factory=dict)


@dataclass(frozen=True)
class Resolved:
    """What a client connects with, and the profile that gave anything (None: arguments and environment only)."""

    url: str
    token: str | None
    profile: str | None


def config_path() -> Path:
    """``$ORCHESTRATOR_CONFIG``, else ``$XDG_CONFIG_HOME/orchestrator/config.toml`` (``~/.config`` by default)."""
    if os.environ.get(CONFIG_ENV):
        return Path(os.environ[CONFIG_ENV]).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base).expanduser() / "orchestrator" / "config.toml"


def load_config(path: Path | None = None) -> Config:
    """The config file's profiles; an empty Config when there is no file."""
    path = path or config_path()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return Config()
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    profiles = {}
    for name, values in (data.get("profiles") or {}).items():
        if not isinstance(values, dict):
            raise ConfigError(f"{path}: [profiles.{name}] must be a table with url and token")
        profiles[name] = Profile(name=name, url=values.get("url"), token=values.get("token"))
    return Config(default_profile=data.get("default_profile"), profiles=profiles)


def save_profile(name: str, url: str, token: str | None, make_default: bool = True, path: Path | None = None) -> Path:
    """Add or replace profile ``name`` (and make it the default); returns the file written (0600, folder 0700)."""
    path = path or config_path()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        data = {}
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    profile = {"url": url, **({"token": token} if token else {})}
    data.setdefault("profiles", {})[name] = profile
    if make_default or not data.get("default_profile"):
        data["default_profile"] = name
    _write_private(path, tomli_w.dumps(data))
    return path


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by its owner only, replacing the file in one step."""
    created = not path.parent.exists()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if created or path.parent.name == "orchestrator":  # our own folder: keep it private even if made earlier
        os.chmod(path.parent, 0o700)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=".config-", suffix=".toml")  # mkstemp: mode 0600
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(temporary, 0o600)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _same_server(a: str | None, b: str | None) -> bool:
    return a is not None and b is not None and a.rstrip("/") == b.rstrip("/")


def resolve(
    url: str | None = None, token: str | None = None, profile: str | None = None, path: Path | None = None
) -> Resolved:
    """Each of url and token: the argument, else its environment variable, else the profile (``profile``, else
    ``$ORCHESTRATOR_PROFILE``, else the file's ``default_profile``, else one named ``default``). A profile's
    token is sent only to that profile's url: a url from elsewhere never receives a stored key."""
    url = url or os.environ.get(URL_ENV) or None
    token = token or os.environ.get(TOKEN_ENV) or None
    wanted = profile or os.environ.get(PROFILE_ENV) or None
    chosen: Profile | None = None
    if wanted or url is None or token is None:
        config = load_config(path)
        name = wanted or config.default_profile or DEFAULT_PROFILE
        chosen = config.profiles.get(name)
        if chosen is None and wanted:
            known = ", ".join(sorted(config.profiles)) or "none"
            raise ConfigError(f"no profile {wanted!r} in {path or config_path()} (profiles: {known})")
    if chosen is not None:
        if url is None:
            url = chosen.url
        if token is None and (chosen.url is None or _same_server(url, chosen.url)):
            token = chosen.token
    url = (url or DEFAULT_URL).rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"the service's url must start with http:// or https://, not {url!r}")
    return Resolved(url=url, token=token, profile=chosen.name if chosen else None)
