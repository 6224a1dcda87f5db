"""Served models and the Helm chart (docs/security.md, "Served models" and "The Helm chart").

- A deployment requires a key of its project by default (``auth: "project"``), checked by the Serve
  replica; ``auth: "none"`` stays possible and the API says which one a deployment has.
- The replica never reaches the database: the control plane sends it the SHA-256 digests of the
  project's valid keys (never a key) in the Serve config, and sends a new config when they change, so a
  revoked key's digest is gone after the next reconciler pass.
- A replica refuses a body over its ``max_body_mb`` with 413 before parsing it.
- The chart ships a NetworkPolicy in front of the Ray pods, its Ingress does not route ``/internal``, and
  an Ingress with a host always has TLS.

The replica is called over ASGI without Ray (as ``tests/unit/test_serving_app.py`` does); the control
plane runs over the unit tests' app with a fake cluster that records what Serve was asked.
"""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta

import pytest
import torch
from starlette.requests import Request
from starlette.testclient import TestClient

from orchestrator.db.models import ApiKey, utcnow
from tests.unit.api_helpers import ADMIN, auth, make_project
from tests.unit.test_deployments import app_of, finished_job, reconcile
from workers.serve.app import ModelServer
from workers.workloads import digits

DIGITS_CONFIG = {"hidden": 16, "batchnorm": False, "val_fraction": 0.2}
ROW = [float(i % 17) for i in range(64)]


def sha256(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


# --- the control plane: what a deployment says and what Serve is sent ---------------------------------


def test_a_new_deployment_requires_a_project_key_and_the_api_says_which_auth_it_has(app, client, tmp_path):
    project, keys = make_project(client, "served")
    job_id, _ = finished_job(app, tmp_path, project_id=project)
    created = client.post(
        "/v1/deployments", json={"name": "locked", "source": {"job_id": job_id}}, headers=auth(keys["member"])
    )
    assert created.status_code == 201, created.text
    assert (created.json()["auth"], created.json()["max_body_mb"]) == ("project", 1.0)
    open_one = client.post(
        "/v1/deployments",
        json={"name": "open", "source": {"job_id": job_id}, "auth": "none", "max_body_mb": 0.5},
        headers=auth(keys["member"]),
    )
    assert open_one.status_code == 201, open_one.text
    seen = client.get("/v1/deployments/open", headers=auth(keys["viewer"])).json()
    assert (seen["auth"], seen["max_body_mb"]) == ("none", 0.5)
    bad = client.post(
        "/v1/deployments",
        json={"name": "x", "source": {"job_id": job_id}, "auth": "anyone"},
        headers=auth(keys["member"]),
    )
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "auth"]
    # Turning auth on later is a PATCH (a new version, applied in place); a rollback keeps it on.
    patched = client.patch("/v1/deployments/open", json={"auth": "project"}, headers=auth(keys["member"]))
    assert patched.status_code == 200 and patched.json()["target"]["settings"]["auth"] == "project"
    rolled = client.post("/v1/deployments/open/rollback", headers=auth(keys["member"]))
    assert rolled.status_code == 200 and rolled.json()["target"]["settings"]["auth"] == "project", rolled.text


def test_serve_is_sent_the_projects_key_hashes_never_a_key_and_a_revoked_key_leaves_at_the_next_pass(
    app, client, backend, tmp_path
):
    project, keys = make_project(client, "served")
    _, other_keys = make_project(client, "other")
    job_id, _ = finished_job(app, tmp_path, project_id=project)
    assert (
        client.post(
            "/v1/deployments", json={"name": "locked", "source": {"job_id": job_id}}, headers=auth(keys["member"])
        ).status_code
        == 201
    )
    extra = client.post(f"/v1/projects/{project}/keys", json={"role": "viewer"}, headers=auth(ADMIN)).json()
    reconcile(app)
    sent = json.dumps(backend.serve_applied[-1])
    user_config = app_of(backend, "locked")["deployments"][0]["user_config"]
    assert user_config["auth"] == "project" and user_config["max_body_mb"] == 1.0
    assert sorted(user_config["key_hashes"]) == sorted(
        sha256(k) for k in (keys["member"], keys["viewer"], extra["key"])
    )
    for secret in (*keys.values(), *other_keys.values(), extra["key"], ADMIN):
        assert secret not in sent  # no key, of this project or any other, nor the admin token
    assert sha256(other_keys["member"]) not in sent and sha256(ADMIN) not in sent

    applied = len(backend.serve_applied)
    assert client.delete(f"/v1/projects/{project}/keys/{extra['id']}", headers=auth(ADMIN)).status_code == 204
    reconcile(app)
    assert len(backend.serve_applied) == applied + 1  # the key change alone re-applies the config
    hashes = app_of(backend, "locked")["deployments"][0]["user_config"]["key_hashes"]
    assert sha256(extra["key"]) not in hashes and sha256(keys["member"]) in hashes

    # An expired key leaves too (its row stays until revoked).
    with app.state.service.sessions.begin() as session:
        row = session.query(ApiKey).filter_by(key_hash=sha256(keys["viewer"])).one()
        row.expires_at = utcnow() - timedelta(seconds=1)
    reconcile(app)
    assert app_of(backend, "locked")["deployments"][0]["user_config"]["key_hashes"] == [sha256(keys["member"])]


def test_a_deployment_with_auth_none_is_sent_no_key_hashes(app, client, backend, tmp_path):
    project, keys = make_project(client, "served")
    job_id, _ = finished_job(app, tmp_path, project_id=project)
    assert (
        client.post(
            "/v1/deployments",
            json={"name": "open", "source": {"job_id": job_id}, "auth": "none"},
            headers=auth(keys["member"]),
        ).status_code
        == 201
    )
    reconcile(app)
    user_config = app_of(backend, "open")["deployments"][0]["user_config"]
    assert (user_config["auth"], user_config["key_hashes"]) == ("none", [])


# --- the replica: the key check and the body cap ---------------------------------------------------------


@pytest.fixture(scope="module")
def replica(tmp_path_factory):
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("served") / "checkpoint_000001"
    folder.mkdir()
    torch.save(digits.build(DIGITS_CONFIG, 0).model.state_dict(), folder / "model.pt")
    return ModelServer.func_or_class(str(folder), "digits", DIGITS_CONFIG, deployment="digits")


def over_http(server) -> TestClient:
    async def asgi(scope, receive, send):
        response = await server(Request(scope, receive))
        await response(scope, receive, send)

    return TestClient(asgi, follow_redirects=False)


def configure(server, **user_config) -> None:
    server.reconfigure({"version": 1, "max_batch_size": 1, "batch_wait_timeout_s": 0.0, "threads": 1, **user_config})


def test_a_replica_with_auth_project_answers_only_a_valid_project_key(replica):
    key, revoked = "ork_valid-key", "ork_revoked-key"
    http = over_http(replica)
    body = {"inputs": [ROW]}
    configure(replica, auth="project", key_hashes=[sha256(key), sha256(revoked)])
    assert http.post("/digits", json=body, headers=auth(key)).status_code == 200
    for headers in ({}, auth("ork_wrong"), {"Authorization": f"Basic {key}"}, {"Authorization": sha256(key)}):
        response = http.post("/digits", json=body, headers=headers)
        assert response.status_code == 401, headers
        assert response.headers["www-authenticate"] == "Bearer"
    assert http.get("/digits").status_code == 401  # describing the model (its checkpoint path) too
    # The control plane re-applies the config without the revoked key: it stops working in place.
    configure(replica, auth="project", key_hashes=[sha256(key)])
    assert http.post("/digits", json=body, headers=auth(revoked)).status_code == 401
    assert http.post("/digits", json=body, headers=auth(key)).status_code == 200
    # A config that says nothing about auth is closed, not open.
    configure(replica)
    assert http.post("/digits", json=body, headers=auth(key)).status_code == 401
    configure(replica, auth="none")
    assert http.post("/digits", json=body).status_code == 200


def test_a_replica_refuses_a_body_over_its_cap_with_413_before_parsing(replica):
    http = over_http(replica)
    configure(replica, auth="none", max_body_mb=0.01)  # 10 kB
    small = json.dumps({"inputs": [ROW]}).encode()
    assert http.post("/digits", content=small, headers={"content-type": "application/json"}).status_code == 200
    big = b"[" + b"0," * 20_000  # not even JSON: refused on its size, never parsed (no 400)
    response = http.post("/digits", content=big)
    assert response.status_code == 413 and "max_body_mb" in response.json()["detail"]

    def chunks():  # no Content-Length: cut off as soon as what arrived passes the cap
        for _ in range(100):
            yield b"0" * 1000

    assert http.post("/digits", content=chunks()).status_code == 413
    configure(replica, auth="none")  # default: 1 MB
    assert http.post("/digits", content=big).status_code == 400  # under the default cap: parsed, not JSON
    assert http.post("/digits", content=b"0" * 1_000_001).status_code == 413


# --- the Helm chart ------------------------------------------------------------------------------------------


def _chart():
    from tests.unit import test_deploy_chart as chart

    return chart


@pytest.mark.parametrize("values_name", ["external-db-values.yaml", "gpu-postgresql-values.yaml"])
def test_the_chart_ships_a_network_policy_in_front_of_the_ray_heads_ports(values_name):
    chart = _chart()
    objects = chart.render(chart.values_file(values_name))
    policy = chart.one(objects, "NetworkPolicy", f"{chart.RELEASE}-orchestrator-ray")  # the Ray pods' ingress
    doc = {k: v for k, v in policy.items() if k != "__template"}
    for version in chart.K8S_VERSIONS:
        chart.kubernetes_validate.validate(doc, version, strict=True)
    cluster = chart.one(objects, "RayCluster")["metadata"]["name"]
    assert policy["spec"]["podSelector"]["matchLabels"] == {"ray.io/cluster": cluster}
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    head_ports = {6379, 8265, 10001}
    for rule in policy["spec"]["ingress"]:
        ports = {p["port"] for p in rule.get("ports", [])}
        peers = rule.get("from")
        if not peers:  # open to anyone: only Serve's HTTP port
            assert ports == {8001}, rule
        elif not ports:  # every port: only the Ray cluster's own pods
            assert peers == [{"podSelector": {"matchLabels": {"ray.io/cluster": cluster}}}], rule
        else:
            assert ports & head_ports, rule
            labels = peers[0]["podSelector"]["matchLabels"]
            assert labels["app.kubernetes.io/component"] == "control-plane", rule


def test_the_public_ingress_never_routes_internal_and_has_tls_whenever_it_has_a_host():
    chart = _chart()
    base = chart.values_file("external-db-values.yaml")
    for ingress_values in (
        {"enabled": True, "host": "api.example.com"},  # no TLS secret named: TLS on all the same
        {"enabled": True, "host": "api.example.com", "tlsSecretName": "api-cert"},
    ):
        ingress = chart.one(chart.render(base | {"ingress": ingress_values}), "Ingress")
        paths = [p["path"] for rule in ingress["spec"]["rules"] for p in rule["http"]["paths"]]
        assert paths and not [p for p in paths if p == "/" or p.startswith("/internal")], paths
        tls = ingress["spec"]["tls"]
        assert tls[0]["hosts"] == ["api.example.com"]
        assert tls[0]["secretName"] == ingress_values.get("tlsSecretName", f"{chart.RELEASE}-orchestrator-tls")
    for bad in (["/"], ["/v1", "/internal"], ["/internal/v1/jobs"]):
        with pytest.raises(chart.helm.HelmRenderError, match="/internal"):
            chart.render(base | {"ingress": {"enabled": True, "host": "api.example.com", "paths": bad}})
