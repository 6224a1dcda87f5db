"""Driving the dashboard (/ui) in the unit tests: sign in through the form, read the CSRF token a page
carries, post forms. Used by tests/unit/test_ui_*.py (the fixtures are tests/unit/conftest.py's)."""

from __future__ import annotations

import re

from tests.unit.api_helpers import ADMIN, auth

_HIDDEN_CSRF = re.compile(r'name="csrf_token" value="([^"]*)"')
_META_CSRF = re.compile(r'<meta name="csrf-token" content="([^"]*)"')


def login(client, key: str, next_url: str | None = None):
    """Sign in with ``key`` through the sign-in form (signed out first); returns the POST's answer (303 on
    success)."""
    client.cookies.clear()
    form = client.get("/ui/login")
    assert form.status_code == 200, form.text
    token = _HIDDEN_CSRF.search(form.text).group(1)
    data = {"api_key": key, "csrf_token": token}
    if next_url is not None:
        data["next"] = next_url
    return client.post("/ui/login", data=data, follow_redirects=False)


def signed_in(client, key: str):
    answer = login(client, key)
    assert answer.status_code == 303, answer.text
    return client


def csrf(client, page: str = "/ui/jobs") -> str:
    """The session's CSRF token, as the pages carry it."""
    answer = client.get(page)
    assert answer.status_code == 200, answer.text
    return _META_CSRF.search(answer.text).group(1)


def new_key(client, project_id: str, role: str) -> tuple[str, str]:
    """A key of ``role`` in the project: (id, secret)."""
    answer = client.post(f"/v1/projects/{project_id}/keys", json={"role": role}, headers=auth(ADMIN))
    assert answer.status_code == 201, answer.text
    return answer.json()["id"], answer.json()["key"]
