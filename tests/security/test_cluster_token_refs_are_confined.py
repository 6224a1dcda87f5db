"""A cluster's ``token_ref`` says where the control plane reads the token it then sends, as a Bearer header, to the
cluster's address, which the admin key registering it chose. Unconfined, ``file:/path`` read any file of the
control plane's machine and ``env:NAME`` any of its variables (the database URL, the admin token) and sent them to
that address. Now ``env:`` names only ``RAY_TOKEN_*`` and ``file:`` only a file inside
``ORCHESTRATOR_CLUSTER_TOKEN_DIR`` (links followed): anything else is a 422 at the API, and a row written some other
way is refused when read, with nothing sent anywhere."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from orchestrator.backend import BackendUnavailable
from orchestrator.backend.registry import ClusterBackends
from orchestrator.repositories import clusters as clusters_repo
from tests.unit.api_helpers import ADMIN, auth

SECRET = "the-control-planes-own-secret"


@pytest.fixture
def token_dir(tmp_path) -> Path:
    folder = tmp_path / "cluster-tokens"
    folder.mkdir()
    return folder


@pytest.fixture
def settings_overrides(token_dir) -> dict:
    return {"cluster_token_dir": str(token_dir)}


def register(client, token_ref: str, name: str = "x"):
    body = {"name": name, "address": f"http://{name}-head:8265", "token_ref": token_ref}
    return client.post("/v1/clusters", json=body, headers=auth(ADMIN))


def refused(response, *words: str) -> None:
    assert response.status_code == 422, response.text
    (detail,) = response.json()["detail"]
    assert detail["loc"][-1] == "token_ref", detail
    for word in words:
        assert word in detail["msg"], detail
    assert SECRET not in response.text


def test_env_refs_name_only_ray_token_variables(client, monkeypatch):
    monkeypatch.setenv("ORCHESTRATOR_SOMETHING_SECRET", SECRET)
    for name in ("ORCHESTRATOR_SOMETHING_SECRET", "ORCHESTRATOR_DATABASE_URL", "HOME", "RAY_TOKEN_", "RAY_AUTH_TOKEN"):
        refused(register(client, f"env:{name}"), "RAY_TOKEN_<NAME>")
    assert register(client, "env:RAY_TOKEN_X").status_code == 201


def test_file_refs_stay_inside_the_token_dir_links_followed(client, token_dir, tmp_path):
    outside = tmp_path / "secret.txt"
    outside.write_text(SECRET)
    os.symlink(outside, token_dir / "link")  # a link inside the folder to a file outside it
    for path in ("/etc/passwd", str(outside), f"{token_dir}/../secret.txt", str(token_dir / "link"), str(token_dir)):
        refused(register(client, f"file:{path}"), "must be inside", str(token_dir), "ORCHESTRATOR_CLUSTER_TOKEN_DIR")
    assert register(client, f"file:{token_dir / 'x'}").status_code == 201
    # A PATCH is checked the same way; the refused change is not written.
    patched = client.patch("/v1/clusters/x", json={"token_ref": f"file:{outside}"}, headers=auth(ADMIN))
    refused(patched)
    assert client.get("/v1/clusters/x", headers=auth(ADMIN)).json()["token_ref"] == f"file:{token_dir / 'x'}"
    assert [c["name"] for c in client.get("/v1/clusters", headers=auth(ADMIN)).json()].count("x") == 1


def test_a_ref_written_around_the_api_is_refused_when_read_and_nothing_is_sent(app, token_dir, tmp_path, monkeypatch):
    """An older version's row, or one written by hand: the registry checks again before reading anything."""
    monkeypatch.setenv("ORCHESTRATOR_SOMETHING_SECRET", SECRET)
    outside = tmp_path / "secret.txt"
    outside.write_text(SECRET)
    (token_dir / "good").write_text("the-right-token")
    sessions = app.state.service.sessions
    with sessions.begin() as session:
        clusters_repo.create_cluster(
            session, "by-env", "http://evil-a:8265", token_ref="env:ORCHESTRATOR_SOMETHING_SECRET"
        )
        clusters_repo.create_cluster(session, "by-file", "http://evil-b:8265", token_ref=f"file:{outside}")
        clusters_repo.create_cluster(session, "good", "http://good:8265", token_ref=f"file:{token_dir / 'good'}")
    connected: list[tuple[str, str | None]] = []
    registry = ClusterBackends(
        sessions, lambda address, token: connected.append((address, token)) or object(), token_dir=str(token_dir)
    )
    registry.refresh()
    for name in ("by-env", "by-file"):
        with pytest.raises(BackendUnavailable, match="is not allowed") as raised:
            registry.get(name)
        assert SECRET not in str(raised.value)
    registry.get("good")
    assert connected == [("http://good:8265", "the-right-token")]  # the refused ones reached no address
