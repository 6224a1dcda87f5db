"""Ray's State API over HTTP, for the tests that look at what a real cluster is running."""

from __future__ import annotations

import httpx


def state_api(dashboard_url: str, token: str, resource: str, **equal: str) -> list[dict]:
    """``GET /api/v0/<resource>`` (actors, nodes, placement_groups...) with detail, filtered on
    ``key == value`` pairs."""
    params: list[tuple[str, str]] = [("limit", "10000"), ("detail", "true")]
    for key, value in equal.items():
        params += [("filter_keys", key), ("filter_predicates", "="), ("filter_values", value)]
    response = httpx.get(
        f"{dashboard_url}/api/v0/{resource}", params=params, headers={"Authorization": f"Bearer {token}"}, timeout=30
    )
    response.raise_for_status()
    return response.json()["data"]["result"]["result"]
