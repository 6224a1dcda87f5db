"""The server secret the dashboard's cookies are signed with: ORCHESTRATOR_UI_SECRET, or one made once and
kept in <var_dir>/ui-secret (0600) so that sessions outlive a restart of the control plane."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from orchestrator.settings import Settings

SECRET_FILE = "ui-secret"
MIN_CHARS = 32


def ui_secret(settings: Settings) -> str:
    if settings.ui_secret:
        return settings.ui_secret
    path = settings.var_path / SECRET_FILE
    try:
        return _read(path)
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    made = secrets.token_urlsafe(48)
    try:  # O_EXCL: two processes starting at once keep the one secret that was written first
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return _read(path)
    with os.fdopen(fd, "w") as out:
        out.write(made)
    return made


def _read(path: Path) -> str:
    secret = path.read_text().strip()
    if len(secret) < MIN_CHARS:
        raise RuntimeError(
            f"{path} holds {len(secret)} characters, fewer than {MIN_CHARS}: delete it or set ORCHESTRATOR_UI_SECRET"
        )
    return secret
