"""The REST layer of several Ray clusters behind one control plane (docs/clusters.md): registering clusters
(``/v1/clusters``, cluster-wide admins only) and binding projects to them (``/v1/projects/{id}/clusters``), over the
fake cluster, on SQLite and PostgreSQL. Where runs are placed is the scheduler's (its own tests)."""

from __future__ import annotations

import pytest

from orchestrator.db.models import Job, JobState
from orchestrator.repositories import clusters as clusters_repo
from tests.security.helpers import make_key
from tests.unit.api_helpers import ADMIN, auth, make_project, new_job

TOKEN = "s3cr3t-ray-token-value"
ADMIN_H = auth(ADMIN)


def default_cluster(app) -> str:
    """The default cluster's name: the one ControlPlane.start() registered, or one registered here as it does."""
    service = app.state.service
    with service.sessions.begin() as session:
        cluster = clusters_repo.default_cluster(session)
        if cluster is None:
            name = getattr(service.settings, "cluster_name", None) or "local"
            cluster = clusters_repo.ensure_default_cluster(session, name, "http://127.0.0.1:8265", None)
        return cluster.name


def register(client, name: str, **fields) -> dict:
    body = {"name": name, "address": f"http://{name}-head:8265", **fields}
    response = client.post("/v1/clusters", json=body, headers=ADMIN_H)
    assert response.status_code == 201, response.text
    return response.json()


def bind(client, project_id: str, *clusters: str, key: str = ADMIN):
    return client.put(f"/v1/projects/{project_id}/clusters", json={"clusters": list(clusters)}, headers=auth(key))


def test_a_cluster_admin_registers_lists_gets_changes_and_deletes_a_cluster(app, client):
    default = default_cluster(app)
    made = register(
        client, "gpu-a", token_ref="env:RAY_TOKEN_GPU_A", labels={"gpu": "h100"}, storage_root="s3://b/gpu-a"
    )
    assert made["name"] == "gpu-a" and made["address"] == "http://gpu-a-head:8265"
    assert made["token_ref"] == "env:RAY_TOKEN_GPU_A" and made["labels"] == {"gpu": "h100"}
    assert made["storage_root"] == "s3://b/gpu-a" and made["tenancy"] == "shared"
    assert made["is_default"] is False and made["projects"] == [] and made["created_at"]
    listed = client.get("/v1/clusters", headers=ADMIN_H).json()
    assert [c["name"] for c in listed] == sorted([default, "gpu-a"])
    assert next(c for c in listed if c["name"] == default)["is_default"] is True
    assert client.get("/v1/clusters/gpu-a", headers=ADMIN_H).json() == made

    # PATCH: what is given changes, the rest stays; token_ref and storage_root may go back to null.
    patched = client.patch(
        "/v1/clusters/gpu-a",
        json={"address": "https://gpu-a.example:8443/", "token_ref": None, "labels": {"gpu": "a100"}},
        headers=ADMIN_H,
    )
    assert patched.status_code == 200, patched.text
    body = patched.json()
    assert body["address"] == "https://gpu-a.example:8443" and body["token_ref"] is None
    assert body["labels"] == {"gpu": "a100"} and body["storage_root"] == "s3://b/gpu-a" and body["tenancy"] == "shared"
    assert client.patch("/v1/clusters/gpu-a", json={"tenancy": "dedicated"}, headers=ADMIN_H).json()["tenancy"] == (
        "dedicated"
    )
    # The name can't change; null where null means nothing is refused; unknown clusters are 404.
    renamed = client.patch("/v1/clusters/gpu-a", json={"name": "gpu-b"}, headers=ADMIN_H)
    assert renamed.status_code == 422 and "name" in renamed.text
    nulled = client.patch("/v1/clusters/gpu-a", json={"address": None}, headers=ADMIN_H)
    assert nulled.status_code == 422 and "address may not be null" in nulled.text
    for method in ("GET", "PATCH", "DELETE"):
        missing = client.request(method, "/v1/clusters/nope", json={} if method == "PATCH" else None, headers=ADMIN_H)
        assert missing.status_code == 404 and "no cluster named 'nope'" in missing.text, (method, missing.text)

    assert client.delete("/v1/clusters/gpu-a", headers=ADMIN_H).status_code == 204
    assert client.get("/v1/clusters/gpu-a", headers=ADMIN_H).status_code == 404
    assert [c["name"] for c in client.get("/v1/clusters", headers=ADMIN_H).json()] == [default]


def test_a_taken_name_or_address_is_409_and_a_bad_field_is_422_naming_it(app, client):
    register(client, "gpu-a")
    taken = client.post("/v1/clusters", json={"name": "gpu-a", "address": "http://other:8265"}, headers=ADMIN_H)
    assert taken.status_code == 409 and "a cluster named 'gpu-a' already exists" in taken.text
    same_ray = client.post(
        "/v1/clusters", json={"name": "gpu-b", "address": "http://GPU-A-head:8265/"}, headers=ADMIN_H
    )
    assert same_ray.status_code == 409 and "cluster 'gpu-a' already has the address" in same_ray.text
    moved_onto = client.patch("/v1/clusters/gpu-a", json={"address": "http://gpu-a-head:8265"}, headers=ADMIN_H)
    assert moved_onto.status_code == 200  # its own address is no conflict
    bad = {
        "name": {"name": "GPU_A", "address": "http://x:8265"},
        "address": {"name": "x", "address": "ftp://x:8265"},
        "token_ref": {"name": "x", "address": "http://x:8265", "token_ref": "plain-token"},
        "labels": {"name": "x", "address": "http://x:8265", "labels": {f"k{i}": "v" for i in range(17)}},
        "tenancy": {"name": "x", "address": "http://x:8265", "tenancy": "private"},
        "token": {"name": "x", "address": "http://x:8265", "token": TOKEN},  # the token itself is never sent
    }
    for field, body in bad.items():
        refused = client.post("/v1/clusters", json=body, headers=ADMIN_H)
        assert refused.status_code == 422 and field in {str(p) for e in refused.json()["detail"] for p in e["loc"]}, (
            field,
            refused.text,
        )
    file_ref = register(client, "x", token_ref="file:/var/run/orchestrator/cluster-tokens/ray-token")
    assert file_ref["token_ref"] == "file:/var/run/orchestrator/cluster-tokens/ray-token"


def test_the_token_is_never_in_an_answer_only_where_it_is_read(app, client, monkeypatch):
    monkeypatch.setenv("RAY_TOKEN_GPU_A", TOKEN)
    default_cluster(app)
    project_id, _ = make_project(client, "vision")
    answers = [
        client.post(
            "/v1/clusters",
            json={"name": "gpu-a", "address": "http://a:8265", "token_ref": "env:RAY_TOKEN_GPU_A"},
            headers=ADMIN_H,
        ),
        client.get("/v1/clusters", headers=ADMIN_H),
        client.get("/v1/clusters/gpu-a", headers=ADMIN_H),
        client.patch("/v1/clusters/gpu-a", json={"labels": {"gpu": "h100"}}, headers=ADMIN_H),
        bind(client, project_id, "gpu-a"),
        client.get(f"/v1/projects/{project_id}/clusters", headers=ADMIN_H),
        client.get("/openapi.json"),
    ]
    assert [a.status_code for a in answers] == [201, 200, 200, 200, 200, 200, 200]
    assert all(TOKEN not in a.text for a in answers)
    assert answers[2].json()["token_ref"] == "env:RAY_TOKEN_GPU_A"
    with app.state.service.sessions() as session:  # nor is it stored
        row = clusters_repo.get_cluster(session, "gpu-a")
        assert TOKEN not in repr({c.name: getattr(row, c.name) for c in row.__table__.columns})


def test_only_a_cluster_wide_admin_reaches_the_clusters(app, client):
    register(client, "gpu-a")
    project_id, keys = make_project(client, "vision")
    keys["admin"] = make_key(client, project_id, "admin")["key"]
    routes = [
        ("POST", "/v1/clusters", {"name": "gpu-b", "address": "http://b:8265"}),
        ("GET", "/v1/clusters", None),
        ("GET", "/v1/clusters/gpu-a", None),
        ("PATCH", "/v1/clusters/gpu-a", {"tenancy": "dedicated"}),
        ("DELETE", "/v1/clusters/gpu-a", None),
        ("PUT", f"/v1/projects/{project_id}/clusters", {"clusters": ["gpu-a"]}),
    ]
    for role, key in keys.items():
        for method, path, body in routes:
            answer = client.request(method, path, json=body, headers=auth(key))
            assert answer.status_code == 403 and "cluster-wide admin" in answer.text, (role, method, path, answer.text)
    assert client.get("/v1/clusters", headers=auth("no-such-key")).status_code == 401
    # Nothing changed: the cluster is there, shared, with no project.
    assert client.get("/v1/clusters/gpu-a", headers=ADMIN_H).json()["tenancy"] == "shared"
    assert client.get(f"/v1/projects/{project_id}/clusters", headers=ADMIN_H).json()["default"] is True


def test_a_project_is_bound_to_clusters_and_its_keys_see_where_it_runs(app, client):
    default = default_cluster(app)
    register(client, "gpu-a", labels={"gpu": "h100"})
    register(client, "gpu-b")
    project_id, keys = make_project(client, "vision")
    other_id, other_keys = make_project(client, "speech")

    unbound = client.get(f"/v1/projects/{project_id}/clusters", headers=auth(keys["viewer"]))
    assert unbound.status_code == 200, unbound.text
    assert unbound.json()["project_id"] == project_id and unbound.json()["default"] is True
    assert [c["name"] for c in unbound.json()["clusters"]] == [default]
    assert unbound.json()["clusters"][0]["is_default"] is True

    bound = bind(client, project_id, "gpu-b", "gpu-a")
    assert bound.status_code == 200, bound.text
    assert bound.json()["default"] is False and [c["name"] for c in bound.json()["clusters"]] == ["gpu-a", "gpu-b"]
    seen = client.get(f"/v1/projects/{project_id}/clusters", headers=auth(keys["member"]))
    assert seen.json() == bound.json()
    assert seen.json()["clusters"][0]["labels"] == {"gpu": "h100"}
    assert "address" not in seen.json()["clusters"][0] and "token_ref" not in seen.json()["clusters"][0]
    assert client.get("/v1/clusters/gpu-a", headers=ADMIN_H).json()["projects"] == ["vision"]
    # PUT replaces the bindings.
    assert [c["name"] for c in bind(client, project_id, "gpu-b").json()["clusters"]] == ["gpu-b"]
    assert client.get("/v1/clusters/gpu-a", headers=ADMIN_H).json()["projects"] == []
    # Another project's keys find nothing of it; an unknown project is 404 too.
    assert client.get(f"/v1/projects/{project_id}/clusters", headers=auth(other_keys["member"])).status_code == 404
    assert client.get("/v1/projects/nope/clusters", headers=ADMIN_H).status_code == 404
    assert bind(client, "nope", "gpu-a").status_code == 404
    assert client.get(f"/v1/projects/{other_id}/clusters", headers=auth(other_keys["member"])).json()["default"]


def test_binding_unknown_or_repeated_clusters_is_422_naming_them_and_the_registered_ones(app, client):
    default = default_cluster(app)
    register(client, "gpu-a")
    project_id, _ = make_project(client, "vision")
    unknown = bind(client, project_id, "gpu-a", "gpu-z", "tpu-1")
    assert unknown.status_code == 422, unknown.text
    detail = unknown.json()["detail"][0]
    assert detail["loc"] == ["body", "clusters"]
    assert "no cluster named gpu-z, tpu-1" in detail["msg"]
    assert f"the registered clusters are: {', '.join(sorted(['gpu-a', default]))}" in detail["msg"]
    repeated = bind(client, project_id, "gpu-a", "gpu-a")
    assert repeated.status_code == 422 and "each cluster once: gpu-a given more than once" in repeated.text
    assert bind(client, project_id).status_code == 422  # at least one
    assert bind(client, project_id, *[f"c{i}" for i in range(33)]).status_code == 422  # at most 32
    # Nothing was bound.
    assert client.get(f"/v1/projects/{project_id}/clusters", headers=ADMIN_H).json()["default"] is True


def test_a_dedicated_cluster_runs_one_projects_code_only(app, client):
    default = default_cluster(app)
    register(client, "team-a", tenancy="dedicated")
    register(client, "shared-1")
    vision, _ = make_project(client, "vision")
    speech, _ = make_project(client, "speech")
    assert bind(client, vision, "team-a").status_code == 200
    assert bind(client, vision, "team-a").status_code == 200  # binding again is no conflict with itself
    taken = bind(client, speech, "shared-1", "team-a")
    assert taken.status_code == 409, taken.text
    assert "cluster 'team-a' is dedicated to project vision" in taken.text
    assert client.get(f"/v1/projects/{speech}/clusters", headers=ADMIN_H).json()["default"] is True  # unchanged

    # A shared cluster two projects are bound to can't be made dedicated; with one it can.
    assert bind(client, vision, "team-a", "shared-1").status_code == 200
    assert bind(client, speech, "shared-1").status_code == 200
    refused = client.patch("/v1/clusters/shared-1", json={"tenancy": "dedicated"}, headers=ADMIN_H)
    assert refused.status_code == 409, refused.text
    assert "2 projects are bound to it (speech, vision)" in refused.text
    assert bind(client, vision, "team-a").status_code == 200
    assert client.patch("/v1/clusters/shared-1", json={"tenancy": "dedicated"}, headers=ADMIN_H).status_code == 200
    # The default cluster serves every unbound project: it is never dedicated.
    on_default = client.patch(f"/v1/clusters/{default}", json={"tenancy": "dedicated"}, headers=ADMIN_H)
    assert on_default.status_code == 409 and "default cluster" in on_default.text


def test_the_default_cluster_is_not_deleted_nor_is_its_address_changed_through_the_api(app, client):
    default = default_cluster(app)
    refused = client.delete(f"/v1/clusters/{default}", headers=ADMIN_H)
    assert (
        refused.status_code == 409 and "is the default cluster" in refused.text and "can't be deleted" in refused.text
    )
    moved = client.patch(f"/v1/clusters/{default}", json={"address": "http://elsewhere:8265"}, headers=ADMIN_H)
    assert moved.status_code == 409 and "come from the service's settings" in moved.text
    ported = client.patch(f"/v1/clusters/{default}", json={"serve_port": 8123}, headers=ADMIN_H)
    assert ported.status_code == 409 and "serve_port" in ported.text and "ORCHESTRATOR_SERVE_PORT" in ported.text
    labelled = client.patch(f"/v1/clusters/{default}", json={"labels": {"site": "lab"}}, headers=ADMIN_H)
    assert labelled.status_code == 200 and labelled.json()["labels"] == {"site": "lab"}
    assert client.get(f"/v1/clusters/{default}", headers=ADMIN_H).status_code == 200


def test_a_cluster_with_live_runs_or_a_project_bound_to_it_alone_is_not_deleted(app, client, sessions):
    register(client, "gpu-a")
    register(client, "gpu-b")
    service = app.state.service
    job_id = new_job(service.sessions)
    with service.sessions.begin() as session:
        session.get(Job, job_id).cluster = "gpu-a"
    busy = client.delete("/v1/clusters/gpu-a", headers=ADMIN_H)
    assert busy.status_code == 409, busy.text
    assert "cluster 'gpu-a' still has 1 run or deployment on it" in busy.text
    with service.sessions.begin() as session:
        session.get(Job, job_id).state = JobState.CANCELLED

    vision, _ = make_project(client, "vision")
    speech, _ = make_project(client, "speech")
    assert bind(client, vision, "gpu-a").status_code == 200
    assert bind(client, speech, "gpu-a", "gpu-b").status_code == 200
    only = client.delete("/v1/clusters/gpu-a", headers=ADMIN_H)
    assert only.status_code == 409, only.text
    assert "the only cluster of project vision" in only.text and "speech" not in only.text
    assert bind(client, vision, "gpu-b").status_code == 200
    assert client.delete("/v1/clusters/gpu-a", headers=ADMIN_H).status_code == 204
    # speech's binding to it went with it; it keeps gpu-b.
    names = [c["name"] for c in client.get(f"/v1/projects/{speech}/clusters", headers=ADMIN_H).json()["clusters"]]
    assert names == ["gpu-b"]


def test_trust_says_whose_code_shares_a_cluster(app, client):
    default = default_cluster(app)
    register(client, "team-a", tenancy="dedicated")
    register(client, "shared-1")
    vision, vision_keys = make_project(client, "vision")
    speech, _ = make_project(client, "speech")

    assert client.get("/v1/clusters/team-a", headers=ADMIN_H).json()["trust"] == (
        "dedicated: only the one project bound to it may run here; none is bound yet, so nothing runs here."
    )
    bind(client, vision, "team-a", "shared-1")
    bind(client, speech, "shared-1")
    dedicated = client.get("/v1/clusters/team-a", headers=ADMIN_H).json()["trust"]
    assert dedicated == "dedicated: only project vision's code runs here; no other project's run is placed on it."
    shared = client.get("/v1/clusters/shared-1", headers=ADMIN_H).json()["trust"]
    assert shared.startswith("shared: project speech and project vision run here and so trust each other")
    assert "a Ray cluster is one trust domain" in shared
    on_default = client.get(f"/v1/clusters/{default}", headers=ADMIN_H).json()["trust"]
    assert (
        on_default.startswith("shared: every project with no cluster binding run") and "trust each other" in on_default
    )

    # A project's own view counts the others, naming none of them.
    own = client.get(f"/v1/projects/{vision}/clusters", headers=auth(vision_keys["member"])).json()["clusters"]
    trust = {c["name"]: c["trust"] for c in own}
    assert trust["team-a"] == dedicated
    assert trust["shared-1"].startswith("shared: project vision and 1 other project run here and so trust each other")
    assert "speech" not in str(own)


@pytest.mark.parametrize("address", ["not a url", "http://", "head:8265", "file:///etc/passwd", "http://he ad:8265"])
def test_the_address_is_an_http_url(client, address):
    refused = client.post("/v1/clusters", json={"name": "x", "address": address}, headers=ADMIN_H)
    assert refused.status_code == 422 and "the cluster's Ray dashboard URL" in refused.text, refused.text
