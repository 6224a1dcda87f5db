"""Hole 2: keys can be listed (never the secret or its hash) and revoked (401 at once), may expire, record
when they were last used (at most one write a minute per key), and the environment's admin token can be
rotated: ORCHESTRATOR_ADMIN_TOKEN holds several comma-separated tokens during a rotation."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import event, update

from orchestrator.db.models import ApiKey
from tests.security.helpers import make_key
from tests.unit.api_helpers import ADMIN, auth, make_project


def _set_key(app, key_id: str, **values) -> None:
    """A write behind the service's back, as another replica's would be: seen within ORCHESTRATOR_API_KEY_CACHE_S
    (tests/unit/test_key_cache.py); the test forgets the remembered keys instead of waiting that long."""
    with app.state.service.sessions.begin() as session:
        session.execute(update(ApiKey).where(ApiKey.id == key_id).values(**values))
    app.state.service.api_keys.clear()


def test_a_projects_admins_list_its_keys_without_their_secrets(app, client):
    a, a_keys = make_project(client, "alpha")
    b, _ = make_project(client, "beta")
    admin_a = make_key(client, a, "admin", name="ops")
    admin_b = make_key(client, b, "admin")["key"]
    with app.state.service.sessions() as session:
        hashes = set(session.scalars(ApiKey.__table__.select().with_only_columns(ApiKey.key_hash)))

    for by in (ADMIN, admin_a["key"]):
        response = client.get(f"/v1/projects/{a}/keys", headers=auth(by))
        assert response.status_code == 200, response.text
        keys = response.json()
        assert sorted(k["role"] for k in keys) == ["admin", "member", "viewer"]
        ops = next(k for k in keys if k["name"] == "ops")
        assert ops["id"] == admin_a["id"] and ops["created_at"] and ops["expires_at"] is None
        assert {"last_used_at", "expires_at", "created_at", "name", "role"} <= set(ops)
        assert "key" not in ops and "key_hash" not in ops
        for secret in [admin_a["key"], *a_keys.values(), *hashes]:
            assert secret not in response.text
    # Members and viewers may not list; another project's admin does not find the project.
    assert client.get(f"/v1/projects/{a}/keys", headers=auth(a_keys["member"])).status_code == 403
    assert client.get(f"/v1/projects/{a}/keys", headers=auth(admin_b)).status_code == 404


def test_a_revoked_key_answers_401_at_once(client):
    a, a_keys = make_project(client, "alpha")
    b, _ = make_project(client, "beta")
    admin_a = make_key(client, a, "admin")["key"]
    admin_b = make_key(client, b, "admin")["key"]
    member = next(k for k in client.get(f"/v1/projects/{a}/keys", headers=auth(ADMIN)).json() if k["role"] == "member")
    assert client.get("/v1/jobs", headers=auth(a_keys["member"])).status_code == 200

    # Another project's admin can neither see nor revoke it; a key id of another project is not found.
    assert client.delete(f"/v1/projects/{a}/keys/{member['id']}", headers=auth(admin_b)).status_code == 404
    assert client.delete(f"/v1/projects/{b}/keys/{member['id']}", headers=auth(admin_b)).status_code == 404
    assert client.delete(f"/v1/projects/{a}/keys/{member['id']}", headers=auth(a_keys["viewer"])).status_code == 403
    assert client.get("/v1/jobs", headers=auth(a_keys["member"])).status_code == 200

    assert client.delete(f"/v1/projects/{a}/keys/{member['id']}", headers=auth(admin_a)).status_code == 204
    gone = client.get("/v1/jobs", headers=auth(a_keys["member"]))
    assert gone.status_code == 401 and gone.headers["WWW-Authenticate"] == "Bearer"
    assert client.delete(f"/v1/projects/{a}/keys/{member['id']}", headers=auth(admin_a)).status_code == 404
    assert member["id"] not in [k["id"] for k in client.get(f"/v1/projects/{a}/keys", headers=auth(ADMIN)).json()]
    assert client.get("/v1/jobs", headers=auth(a_keys["viewer"])).status_code == 200  # the others still work


def test_a_key_may_expire_and_an_expired_key_answers_401(app, client):
    a, _ = make_project(client, "alpha")
    in_a_day = make_key(client, a, "member", expires_in_days=1)
    expires = datetime.fromisoformat(in_a_day["expires_at"])
    assert timedelta(hours=23) < expires - datetime.now(UTC) <= timedelta(days=1)
    at = (datetime.now(UTC) + timedelta(hours=2)).replace(microsecond=0)
    dated = make_key(client, a, "viewer", expires_at=at.isoformat())
    assert datetime.fromisoformat(dated["expires_at"]) == at
    assert client.get("/v1/jobs", headers=auth(dated["key"])).status_code == 200

    _set_key(app, dated["id"], expires_at=datetime.now(UTC) - timedelta(seconds=1))
    expired = client.get("/v1/jobs", headers=auth(dated["key"]))
    assert expired.status_code == 401 and "expired" in expired.json()["detail"]
    assert client.get("/v1/jobs", headers=auth(in_a_day["key"])).status_code == 200

    past = (datetime.now(UTC) - timedelta(minutes=1)).isoformat()
    for body in ({"expires_at": past}, {"expires_in_days": 0}, {"expires_at": at.isoformat(), "expires_in_days": 1}):
        response = client.post(f"/v1/projects/{a}/keys", json={"role": "member", **body}, headers=auth(ADMIN))
        assert response.status_code == 422, (body, response.text)


def test_last_used_at_is_recorded_at_most_once_a_minute_per_key(app, client):
    a, _ = make_project(client, "alpha")
    key = make_key(client, a, "member")
    listed = {k["id"]: k for k in client.get(f"/v1/projects/{a}/keys", headers=auth(ADMIN)).json()}
    assert listed[key["id"]]["last_used_at"] is None

    writes = []

    def count_key_writes(conn, cursor, statement, *args):
        if statement.lstrip().upper().startswith("UPDATE API_KEYS"):
            writes.append(statement)

    engine = app.state.service.engine
    event.listen(engine, "before_cursor_execute", count_key_writes)
    try:
        for _ in range(10):
            assert client.get("/v1/jobs", headers=auth(key["key"])).status_code == 200
        assert len(writes) == 1
        listed = {k["id"]: k for k in client.get(f"/v1/projects/{a}/keys", headers=auth(ADMIN)).json()}
        first = datetime.fromisoformat(listed[key["id"]]["last_used_at"])
        assert datetime.now(UTC) - first < timedelta(minutes=1)

        # A minute later the next request records it again.
        _set_key(app, key["id"], last_used_at=first - timedelta(minutes=2))
        writes.clear()
        assert client.get("/v1/jobs", headers=auth(key["key"])).status_code == 200
        assert len(writes) == 1
    finally:
        event.remove(engine, "before_cursor_execute", count_key_writes)
    listed = {k["id"]: k for k in client.get(f"/v1/projects/{a}/keys", headers=auth(ADMIN)).json()}
    assert datetime.fromisoformat(listed[key["id"]]["last_used_at"]) >= first


@pytest.mark.parametrize("settings_overrides", [{"admin_token": f" old-token , {ADMIN} "}])
def test_the_admin_token_rotates_through_a_comma_separated_list(client):
    # During a rotation both the old and the new token are admins; neither a part nor the whole string is.
    for token in ("old-token", ADMIN):
        assert client.post("/v1/projects", json={"name": f"p{len(token)}"}, headers=auth(token)).status_code == 201
    for wrong in ("old-token,", f"old-token,{ADMIN}", "old", ""):
        assert client.get("/v1/projects", headers=auth(wrong)).status_code == 401, wrong
