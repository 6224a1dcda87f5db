"""Plain HTTP to a Ray dashboard with token auth (no ray import: usable before Ray is configured).

Ray reads RAY_AUTH_MODE once, when it is imported, so the control plane does not rely on Ray's own
token loading: it sends the token itself, as an Authorization header.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx


def auth_headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def token_from_environment() -> str | None:
    """The token for a cluster named by RAY_ADDRESS, looked up the way Ray's own CLI does."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return os.environ["RAY_AUTH_TOKEN"].strip()
    for candidate in (os.environ.get("RAY_AUTH_TOKEN_PATH"), str(Path.home() / ".ray" / "auth_token")):
        if candidate and Path(candidate).is_file():
            return Path(candidate).read_text().strip()
    return None


def alive_nodes(dashboard_url: str, headers: dict[str, str], timeout_s: float = 10) -> list[dict[str, Any]]:
    """The State API's node list, alive nodes only. Raises httpx.HTTPError or KeyError on failure."""
    response = httpx.get(
        f"{dashboard_url.rstrip('/')}/api/v0/nodes",
        params={"filter_keys": "state", "filter_predicates": "=", "filter_values": "ALIVE", "limit": 10_000},
        headers=headers,
        timeout=timeout_s,
    )
    response.raise_for_status()
    return response.json()["data"]["result"]["result"]
