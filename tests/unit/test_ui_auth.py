"""The dashboard's sign-in: the signed session cookie (attributes, tampering, expiry, a revoked, expired or
rotated key), sign-out, CSRF on every POST, the cluster admin's project switcher, safe redirects."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient
from itsdangerous import TimestampSigner

from orchestrator.db.models import ApiKey, utcnow
from tests.unit.api_helpers import ADMIN, auth, make_project
from tests.unit.ui_helpers import csrf, login, new_key, signed_in


def _cookie_header(answer, name: str) -> str:
    headers = [h for h in answer.headers.get_list("set-cookie") if h.startswith(f"{name}=")]
    assert headers, answer.headers
    return headers[-1]


def test_sign_in_sets_an_http_only_same_site_strict_cookie_that_holds_no_key(client):
    _project, keys = make_project(client, "a")
    answer = login(client, keys["member"])
    assert answer.status_code == 303 and answer.headers["location"] == "/ui/jobs"
    cookie = _cookie_header(answer, "orch_ui")
    attributes = [a.strip().lower() for a in cookie.split(";")]
    assert "httponly" in attributes and "samesite=strict" in attributes and "path=/ui" in attributes
    assert "secure" not in attributes  # plain http here
    assert keys["member"] not in cookie and keys["member"][4:20] not in cookie
    page = client.get("/ui/jobs")
    assert page.status_code == 200 and "Sign out" in page.text
    assert "default-src 'self'" in page.headers["content-security-policy"]


def test_the_cookie_is_secure_over_https(app):
    client = TestClient(app, base_url="https://testserver")
    _project, keys = make_project(client, "a")
    cookie = _cookie_header(login(client, keys["viewer"]), "orch_ui")
    assert "secure" in [a.strip().lower() for a in cookie.split(";")]


def test_a_wrong_key_signs_nobody_in(client):
    answer = login(client, "ork_not-a-key")
    assert answer.status_code == 401 and "unknown API key" in answer.text
    assert not [h for h in answer.headers.get_list("set-cookie") if h.startswith("orch_ui=")]
    assert client.get("/ui/jobs", follow_redirects=False).status_code == 303


def test_the_sign_in_form_needs_its_own_csrf_token(client):
    _project, keys = make_project(client, "a")
    answer = client.post("/ui/login", data={"api_key": keys["member"], "csrf_token": "forged"}, follow_redirects=False)
    assert answer.status_code == 403 and "expired" in answer.text
    assert client.get("/ui/jobs", follow_redirects=False).status_code == 303


def test_without_a_session_pages_redirect_to_sign_in_and_json_is_401(client):
    page = client.get("/ui/jobs?state=RUNNING", follow_redirects=False)
    assert page.status_code == 303
    assert page.headers["location"] == "/ui/login?next=/ui/jobs%3Fstate%3DRUNNING"
    data = client.get("/ui/api/jobs")
    assert data.status_code == 401 and data.json()["detail"]


def test_a_tampered_cookie_is_refused(client):
    _project, keys = make_project(client, "a")
    signed_in(client, keys["viewer"])
    value = client.cookies["orch_ui"]
    for forged in (value[:-2] + ("AA" if not value.endswith("AA") else "BB"), "x" + value, value.replace(".", "", 1)):
        client.cookies.set("orch_ui", forged, path="/ui")
        assert client.get("/ui/jobs", follow_redirects=False).status_code == 303
        assert client.get("/ui/api/jobs").status_code == 401


def test_a_cookie_signed_with_another_secret_is_refused(client, tmp_path):
    from api.ui.session import Signer, new_session

    _project, keys = make_project(client, "a")
    signed_in(client, keys["viewer"])
    key_id = client.get("/v1/me", headers=auth(keys["viewer"])).json().get("key_id")
    other = Signer("another-secret-of-at-least-32-characters!", 3600)
    client.cookies.set("orch_ui", other.dumps(new_session(key_id or "x")), path="/ui")
    assert client.get("/ui/api/jobs").status_code == 401


def test_a_session_ends_after_its_lifetime(client, monkeypatch):
    _project, keys = make_project(client, "a")
    real = TimestampSigner.get_timestamp
    monkeypatch.setattr(TimestampSigner, "get_timestamp", lambda self: int(time.time()) - 13 * 3600)
    signed_in(client, keys["viewer"])  # signed 13 hours ago; sessions last 12 (ORCHESTRATOR_UI_SESSION_HOURS)
    monkeypatch.setattr(TimestampSigner, "get_timestamp", real)
    assert client.get("/ui/jobs", follow_redirects=False).status_code == 303
    assert client.get("/ui/api/jobs").status_code == 401


def test_revoking_the_key_ends_the_session(client):
    project, _ = make_project(client, "a")
    key_id, secret = new_key(client, project, "member")
    signed_in(client, secret)
    assert client.get("/ui/api/jobs").status_code == 200
    assert client.delete(f"/v1/projects/{project}/keys/{key_id}", headers=auth(ADMIN)).status_code == 204
    assert client.get("/ui/api/jobs").status_code == 401
    assert client.get("/ui/jobs", follow_redirects=False).headers["location"].startswith("/ui/login")


def test_an_expired_key_ends_the_session(client, app):
    project, _ = make_project(client, "a")
    key_id, secret = new_key(client, project, "viewer")
    signed_in(client, secret)
    with app.state.service.sessions.begin() as session:
        session.get(ApiKey, key_id).expires_at = utcnow() - timedelta(seconds=1)
    answer = client.get("/ui/api/jobs")
    assert answer.status_code == 401 and "expired" in answer.json()["detail"]


def test_the_admin_token_signs_in_until_it_is_rotated_away(client, app):
    signed_in(client, ADMIN)
    assert client.get("/ui/api/jobs").status_code == 200
    assert ADMIN not in client.cookies["orch_ui"]
    settings = app.state.service.settings
    settings.__dict__["admin_tokens"] = ("new-admin-token", ADMIN)  # 'new,old' while rotating: still in
    assert client.get("/ui/api/jobs").status_code == 200
    settings.__dict__["admin_tokens"] = ("new-admin-token",)  # the old one dropped: the session ends
    assert client.get("/ui/api/jobs").status_code == 401


def test_sign_out_needs_the_csrf_token_and_ends_the_session(client):
    _project, keys = make_project(client, "a")
    signed_in(client, keys["viewer"])
    token = csrf(client)
    assert client.post("/ui/logout", follow_redirects=False).status_code == 403
    assert client.post("/ui/logout", data={"csrf_token": "wrong"}, follow_redirects=False).status_code == 403
    answer = client.post("/ui/logout", data={"csrf_token": token}, follow_redirects=False)
    assert answer.status_code == 303 and answer.headers["location"] == "/ui/login"
    assert client.get("/ui/jobs", follow_redirects=False).status_code == 303


def test_the_csrf_token_is_the_sessions_own(client, app):
    """A token from another session (another user's page) does not pass."""
    _project, keys = make_project(client, "a")
    other = TestClient(app)
    signed_in(other, keys["member"])
    foreign = csrf(other)
    signed_in(client, keys["member"])
    assert client.post("/ui/logout", data={"csrf_token": foreign}, follow_redirects=False).status_code == 403
    assert client.post("/ui/logout", headers={"X-CSRF-Token": csrf(client)}, follow_redirects=False).status_code == 303


@pytest.mark.parametrize("target", ["//evil.example/x", "https://evil.example/", "/v1/jobs", "/ui\\@evil"])
def test_sign_in_only_redirects_inside_the_dashboard(client, target):
    _project, keys = make_project(client, "a")
    answer = login(client, keys["viewer"], next_url=target)
    assert answer.status_code == 303 and answer.headers["location"] == "/ui/jobs"


def test_sign_in_returns_to_the_page_asked_for(client):
    _project, keys = make_project(client, "a")
    answer = login(client, keys["viewer"], next_url="/ui/jobs?state=FAILED")
    assert answer.headers["location"] == "/ui/jobs?state=FAILED"


def test_only_a_cluster_admin_switches_projects(client):
    a, keys_a = make_project(client, "a")
    signed_in(client, keys_a["member"])
    answer = client.post("/ui/project", data={"csrf_token": csrf(client), "project_id": a}, follow_redirects=False)
    assert answer.status_code == 403
    signed_in(client, ADMIN)
    token = csrf(client)
    assert 'id="project-switcher"' in client.get("/ui/jobs").text
    missing = client.post("/ui/project", data={"csrf_token": token, "project_id": "nope"}, follow_redirects=False)
    assert missing.status_code == 404
    answer = client.post("/ui/project", data={"csrf_token": token, "project_id": a}, follow_redirects=False)
    assert answer.status_code == 303
    assert f'<option value="{a}" selected>' in client.get("/ui/jobs").text


def test_the_secret_is_made_once_kept_private_and_outlives_a_restart(tmp_path):
    import stat

    from api.ui.secret import SECRET_FILE, ui_secret
    from orchestrator.settings import Settings

    settings = Settings(var_dir=str(tmp_path / "var"))
    made = ui_secret(settings)
    path = tmp_path / "var" / SECRET_FILE
    assert len(made) >= 32 and path.read_text() == made
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert ui_secret(Settings(var_dir=str(tmp_path / "var"))) == made  # a restart signs with the same one
    assert ui_secret(Settings(var_dir=str(tmp_path / "var"), ui_secret="s" * 32)) == "s" * 32  # the setting wins


def test_a_short_secret_setting_is_refused_by_name():
    from pydantic import ValidationError

    from orchestrator.settings import Settings

    with pytest.raises(ValidationError, match="ui_secret"):
        Settings(ui_secret="too-short")


def test_a_session_survives_a_restart_of_the_service(app, client, tmp_path, backend):
    """Two apps on one var_dir and database: the second accepts the first one's cookie (the same secret)."""
    from api.app import create_app

    _project, keys = make_project(client, "a")
    signed_in(client, keys["viewer"])
    cookie = client.cookies["orch_ui"]
    again = create_app(app.state.service.settings, backend=backend, run_loops=False)
    with TestClient(again) as restarted:
        restarted.cookies.set("orch_ui", cookie, path="/ui")
        assert restarted.get("/ui/api/jobs").status_code == 200
