"""Helpers shared by the security tests."""

from __future__ import annotations

from tests.unit.api_helpers import ADMIN, auth


def make_key(client, project_id: str, role: str, by: str = ADMIN, **body) -> dict:
    response = client.post(f"/v1/projects/{project_id}/keys", json={"role": role, **body}, headers=auth(by))
    assert response.status_code == 201, response.text
    return response.json()
