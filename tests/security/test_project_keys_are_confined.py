"""Hole 3: a key made under a project acts in that project only, whatever its role; cluster-wide admin is
the environment's ORCHESTRATOR_ADMIN_TOKEN (or the key the first start prints), never a project route."""

from __future__ import annotations

from datetime import UTC, datetime

from alembic import command
from sqlalchemy import create_engine, text

from orchestrator.db.migrate import alembic_config, upgrade_head
from tests.security.helpers import make_key
from tests.unit.api_helpers import ADMIN, auth, make_project, submit


def test_a_project_admin_key_sees_and_acts_on_its_own_project_only(client):
    a, _ = make_project(client, "alpha")
    b, b_keys = make_project(client, "beta")
    admin_a = make_key(client, a, "admin")["key"]
    b_job = submit(client, b_keys["member"]).json()["id"]

    assert client.get("/v1/jobs", headers=auth(admin_a)).json()["items"] == []
    for path in ["", "/events", "/metrics", "/checkpoints", "/logs"]:
        assert client.get(f"/v1/jobs/{b_job}{path}", headers=auth(admin_a)).status_code == 404, path
    assert client.post(f"/v1/jobs/{b_job}/cancel", headers=auth(admin_a)).status_code == 404
    assert [p["id"] for p in client.get("/v1/projects", headers=auth(admin_a)).json()] == [a]
    assert client.get("/v1/sweeps", headers=auth(admin_a)).json() == []
    assert client.get("/v1/deployments", headers=auth(admin_a)).json() == []
    # Nor can it submit into, or make keys for, another project, or make projects.
    into_b = client.post(f"/v1/jobs?project_id={b}", json={"workload": "digits"}, headers=auth(admin_a))
    assert into_b.status_code == 404
    assert client.post(f"/v1/projects/{b}/keys", json={"role": "admin"}, headers=auth(admin_a)).status_code == 404
    assert client.post("/v1/projects", json={"name": "gamma"}, headers=auth(admin_a)).status_code == 403

    # In its own project it is an admin: it makes keys there, and its jobs land there.
    member_a = make_key(client, a, "member", by=admin_a)
    assert member_a["project_id"] == a
    job = submit(client, admin_a).json()
    assert job["project_id"] == a
    # The environment's token still sees every project.
    assert {j["id"] for j in client.get("/v1/jobs", headers=auth(ADMIN)).json()["items"]} == {b_job, job["id"]}


def test_asking_for_a_cluster_wide_key_through_a_project_route_is_a_422(client):
    a, _ = make_project(client, "alpha")
    response = client.post(f"/v1/projects/{a}/keys", json={"role": "admin", "scope": "cluster"}, headers=auth(ADMIN))
    assert response.status_code == 422, response.text
    message = response.json()["detail"][0]["msg"]
    assert "cluster-wide" in message and "ORCHESTRATOR_ADMIN_TOKEN" in message, message
    assert response.json()["detail"][0]["loc"] == ["body", "scope"]
    # Saying so explicitly is fine.
    assert (
        client.post(
            f"/v1/projects/{a}/keys", json={"role": "admin", "scope": "project"}, headers=auth(ADMIN)
        ).status_code
        == 201
    )


def test_the_upgrade_confines_every_existing_admin_key_but_the_one_the_first_start_printed(database_url):
    # Before 0006 every admin key acted on every project; the migration keeps that for the service's own
    # bootstrap key only.
    engine = create_engine(database_url)
    try:
        command.upgrade(alembic_config(engine), "0005")
        now = datetime.now(UTC)
        with engine.begin() as connection:
            connection.execute(
                text(
                    "INSERT INTO projects (id, name, created_at) VALUES ('p1', 'default', :now), ('p2', 'beta', :now)"
                ),
                {"now": now},
            )
            for key_id, project, name in [("k1", "p1", "bootstrap"), ("k2", "p2", "bootstrap"), ("k3", "p1", "ops")]:
                connection.execute(
                    text(
                        "INSERT INTO api_keys (id, project_id, name, role, key_hash, prefix, created_at) "
                        "VALUES (:id, :project, :name, 'admin', :id, '', :now)"
                    ),
                    {"id": key_id, "project": project, "name": name, "now": now},
                )
        upgrade_head(engine)
        with engine.connect() as connection:
            rows = dict(connection.execute(text("SELECT id, cluster_wide FROM api_keys")).all())
    finally:
        engine.dispose()
    assert {key: bool(wide) for key, wide in rows.items()} == {"k1": True, "k2": False, "k3": False}
