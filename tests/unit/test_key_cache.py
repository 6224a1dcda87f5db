"""The in-process memory of valid API keys (orchestrator/key_cache.py, ORCHESTRATOR_API_KEY_CACHE_S): a key
seen valid is not looked up again for a few seconds; a revoke through this process, an expiry and a stale
``last_used_at`` end that at once; a revoke elsewhere within the TTL; an unknown key is never remembered."""

from __future__ import annotations

from contextlib import contextmanager
from datetime import timedelta

import pytest
from sqlalchemy import delete, event

from orchestrator.auth import Principal, hash_secret
from orchestrator.db.models import ApiKey, Role, utcnow
from orchestrator.key_cache import KeyCache
from tests.unit.api_helpers import ADMIN, auth, make_project

# --- the memory alone, on a clock the test moves ---


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


PRINCIPAL = Principal(Role.MEMBER, project_id="p", key_id="k1")


def remembered(ttl_s: float = 5.0, **put) -> tuple[KeyCache, Clock]:
    clock = Clock()
    cache = KeyCache(ttl_s, clock=clock)
    values = {"expires_at": None, "last_used_at": utcnow(), "generation": cache.generation, **put}
    cache.put("h1", PRINCIPAL, **values)
    return cache, clock


def test_a_remembered_key_is_used_until_its_ttl_ends():
    cache, clock = remembered(ttl_s=5.0)
    assert cache.get("h1", utcnow()) == PRINCIPAL
    assert cache.get("h2", utcnow()) is None
    clock.now += 4.9
    assert cache.get("h1", utcnow()) == PRINCIPAL
    clock.now += 0.1
    assert cache.get("h1", utcnow()) is None
    assert len(cache) == 0  # dropped, not kept stale


def test_an_expiry_is_exact_whatever_the_ttl():
    expires = utcnow() + timedelta(seconds=30)
    cache, _ = remembered(ttl_s=300.0, expires_at=expires)
    assert cache.get("h1", expires - timedelta(microseconds=1)) == PRINCIPAL
    assert cache.get("h1", expires) is None


def test_a_use_not_recorded_for_a_minute_goes_to_the_database():
    cache, _ = remembered(ttl_s=300.0, last_used_at=utcnow() - timedelta(seconds=59))
    assert cache.get("h1", utcnow()) == PRINCIPAL
    assert cache.get("h1", utcnow() + timedelta(seconds=2)) is None  # last_used_at now older than a minute
    never, _ = remembered(last_used_at=None)
    assert never.get("h1", utcnow()) is None


def test_forget_drops_the_revoked_key_only():
    cache, _ = remembered()
    other = Principal(Role.VIEWER, project_id="p", key_id="k2")
    cache.put("h2", other, None, utcnow(), cache.generation)
    cache.forget("k1")
    assert cache.get("h1", utcnow()) is None and cache.get("h2", utcnow()) == other


def test_a_lookup_that_started_before_a_revoke_is_not_remembered():
    cache = KeyCache(5.0)
    generation = cache.generation  # the request reads it, then looks the key up ...
    cache.forget("k1")  # ... while the key is revoked
    cache.put("h1", PRINCIPAL, None, utcnow(), generation)
    assert cache.get("h1", utcnow()) is None


def test_a_ttl_of_zero_remembers_nothing_and_the_size_is_bounded():
    off = KeyCache(0.0)
    off.put("h1", PRINCIPAL, None, utcnow(), off.generation)
    assert len(off) == 0
    small = KeyCache(5.0, max_entries=2)
    for i in range(3):
        small.put(f"h{i}", PRINCIPAL, None, utcnow(), small.generation)
    assert len(small) == 2 and small.get("h0", utcnow()) is None  # the oldest went


# --- through the API (SQLite and PostgreSQL) ---


@contextmanager
def key_lookups(app):
    """The SELECTs on api_keys the service makes meanwhile."""
    seen: list[str] = []

    def note(conn, cursor, statement, *args):
        if statement.lstrip().upper().startswith("SELECT") and "FROM api_keys" in statement:
            seen.append(statement)

    engine = app.state.service.engine
    event.listen(engine, "before_cursor_execute", note)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", note)


def test_a_key_is_looked_up_once_then_remembered(app, client):
    _, keys = make_project(client, "alpha")
    with key_lookups(app) as lookups:
        for _ in range(5):
            assert client.get("/v1/jobs", headers=auth(keys["member"])).status_code == 200
    assert len(lookups) == 1


@pytest.mark.parametrize("settings_overrides", [{"api_key_cache_s": 0}])
def test_with_the_cache_off_every_request_looks_its_key_up(app, client):
    _, keys = make_project(client, "alpha")
    with key_lookups(app) as lookups:
        for _ in range(3):
            assert client.get("/v1/jobs", headers=auth(keys["member"])).status_code == 200
    assert len(lookups) == 3 and len(app.state.service.api_keys) == 0


def test_an_unknown_key_is_never_remembered(app, client):
    _, keys = make_project(client, "alpha")
    wrong = keys["member"][:-1] + ("A" if keys["member"][-1] != "A" else "B")
    cache = app.state.service.api_keys
    with key_lookups(app) as lookups:
        for _ in range(3):
            assert client.get("/v1/jobs", headers=auth(wrong)).status_code == 401
    assert len(lookups) == 3  # each try costs a lookup: nothing about it is kept
    assert cache.get(hash_secret(wrong), utcnow()) is None and len(cache) == 0


def test_a_revoke_through_this_process_is_401_at_once(app, client):
    project, keys = make_project(client, "alpha")
    assert client.get("/v1/jobs", headers=auth(keys["member"])).status_code == 200  # remembered now
    assert len(app.state.service.api_keys) == 1
    listed = client.get(f"/v1/projects/{project}/keys", headers=auth(ADMIN)).json()
    member = next(k for k in listed if k["role"] == "member")
    assert client.delete(f"/v1/projects/{project}/keys/{member['id']}", headers=auth(ADMIN)).status_code == 204
    assert client.get("/v1/jobs", headers=auth(keys["member"])).status_code == 401
    assert client.get("/v1/jobs", headers=auth(keys["viewer"])).status_code == 200


def test_a_revoke_through_another_replica_is_401_once_the_ttl_has_passed(app, client):
    _, keys = make_project(client, "alpha")
    cache = app.state.service.api_keys
    clock = Clock()
    cache._clock = clock  # the test moves time instead of waiting
    assert client.get("/v1/jobs", headers=auth(keys["member"])).status_code == 200
    with app.state.service.sessions.begin() as session:  # another replica's revoke: a plain delete
        session.execute(delete(ApiKey).where(ApiKey.key_hash == hash_secret(keys["member"])))
    assert client.get("/v1/jobs", headers=auth(keys["member"])).status_code == 200  # within the TTL
    clock.now += app.state.service.settings.api_key_cache_s
    assert client.get("/v1/jobs", headers=auth(keys["member"])).status_code == 401


def test_a_remembered_key_that_expires_is_401_at_once(app, client, monkeypatch):
    project, _ = make_project(client, "alpha")
    made = client.post(
        f"/v1/projects/{project}/keys", json={"role": "member", "expires_in_days": 1}, headers=auth(ADMIN)
    ).json()
    assert client.get("/v1/jobs", headers=auth(made["key"])).status_code == 200  # remembered now
    later = utcnow() + timedelta(days=1, seconds=1)
    monkeypatch.setattr("api.deps.utcnow", lambda: later)  # a day passes within the TTL
    expired = client.get("/v1/jobs", headers=auth(made["key"]))
    assert expired.status_code == 401 and "expired" in expired.json()["detail"]
