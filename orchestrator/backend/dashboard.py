"""Plain HTTP to a Ray dashboard with token auth (no ray import: usable before Ray is configured).

Ray reads RAY_AUTH_MODE once, when it is imported, so the control plane does not rely on Ray's own
token loading: it sends the token itself, as an Authorization header.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
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


SERVE_APPLICATIONS = "/api/serve/applications/"


def serve_applications(dashboard_url: str, headers: dict[str, str], timeout_s: float = 30) -> dict[str, Any]:
    """Serve's instance details (``ServeInstanceDetails``); ``applications`` is empty when Serve isn't
    running. Raises httpx.HTTPError on failure."""
    response = httpx.get(f"{dashboard_url.rstrip('/')}{SERVE_APPLICATIONS}", headers=headers, timeout=timeout_s)
    response.raise_for_status()
    return response.json()


def put_serve_applications(
    dashboard_url: str, headers: dict[str, str], config: dict[str, Any], timeout_s: float = 120
) -> httpx.Response:
    """Declare Serve's whole set of applications (``ServeDeploySchema``). The first call starts Serve's
    controller and proxies, which takes seconds. Returns the response (400: Serve refused the config)."""
    return httpx.put(
        f"{dashboard_url.rstrip('/')}{SERVE_APPLICATIONS}", json=config, headers=headers, timeout=timeout_s
    )


def package_url(dashboard_url: str, uri: str) -> str:
    """Ray's package store through the dashboard: ``gcs://<name>`` is ``/api/packages/gcs/<name>``, the
    route Ray's own JobSubmissionClient uploads a working_dir through."""
    protocol, separator, name = uri.partition("://")
    if not separator or protocol != "gcs" or "/" in name:
        raise ValueError(f"not a Ray package URI: {uri}")
    return f"{dashboard_url.rstrip('/')}/api/packages/{protocol}/{name}"


def package_exists(dashboard_url: str, headers: dict[str, str], uri: str, timeout_s: float = 30) -> bool:
    """Whether Ray's store holds the package (asking also pins it there for a while, as Ray's client relies
    on). Raises httpx.HTTPError on failure."""
    response = httpx.get(package_url(dashboard_url, uri), headers=headers, timeout=timeout_s)
    if response.status_code == 404:
        return False
    response.raise_for_status()
    return True


def put_package(
    dashboard_url: str, headers: dict[str, str], uri: str, chunks: Iterator[bytes], size: int, timeout_s: float = 600
) -> None:
    """Upload a zip into Ray's store, streamed in ``chunks`` (``size`` bytes in all). Raises httpx.HTTPError."""
    response = httpx.put(
        package_url(dashboard_url, uri),
        content=chunks,
        headers={**headers, "Content-Length": str(size), "Content-Type": "application/octet-stream"},
        timeout=timeout_s,
    )
    response.raise_for_status()
