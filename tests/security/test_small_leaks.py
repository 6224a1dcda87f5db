"""Hole 8 (the control plane's part): a taken route's 409 does not name another project's deployment; the
unauthenticated /readyz answers a generic reason (the detail goes to the log); docker compose refuses to
start without a PostgreSQL password instead of using a default one."""

from __future__ import annotations

import logging

import pytest
import yaml
from sqlalchemy.exc import OperationalError

from orchestrator.backend import BackendUnavailable
from tests.unit.api_helpers import make_project
from tests.unit.test_deploy_chart import DEPLOY, _interpolate
from tests.unit.test_deployments import deploy, finished_job


@pytest.fixture
def settings_overrides() -> dict:
    return {"serve_port": 8123, "workload_packages": ""}


def test_a_taken_route_does_not_name_another_projects_deployment(app, client, tmp_path):
    vision_id, vision = make_project(client, "vision")
    speech_id, speech = make_project(client, "speech")
    vision_job, _ = finished_job(app, tmp_path, project_id=vision_id)
    speech_job, _ = finished_job(app, tmp_path, project_id=speech_id)
    created = deploy(client, vision["member"], name="secret-model-x", source={"job_id": vision_job}, route_prefix="/x")
    assert created.status_code == 201, created.text

    taken = deploy(client, speech["member"], name="mine", source={"job_id": speech_job}, route_prefix="/x")
    assert taken.status_code == 409
    detail = taken.json()["detail"]
    assert "route_prefix /x is taken" in detail and "secret-model-x" not in detail and vision_id not in detail
    # Within a project the holder is named: it is the caller's own.
    again = deploy(client, vision["member"], name="other", source={"job_id": vision_job}, route_prefix="/x")
    assert again.status_code == 409 and "'secret-model-x'" in again.json()["detail"]


def test_readyz_says_what_is_down_but_not_the_error_text(app, client, backend, monkeypatch, caplog):
    secret_db = "connection to 10.1.2.3:5432 failed: password authentication failed for user 'orch' (pw hunter2)"
    secret_ray = "dashboard http://10.9.8.7:8265 answered 401: token ray-tok-123 rejected"

    def broken_sessions():
        raise OperationalError("SELECT 1", {}, Exception(secret_db))

    def broken_capacity(fresh: bool = False):
        raise BackendUnavailable(secret_ray)

    monkeypatch.setattr(app.state.service, "sessions", broken_sessions)
    monkeypatch.setattr(backend, "capacity", broken_capacity)
    with caplog.at_level(logging.WARNING):
        response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json() == {"database": "error: unavailable", "ray": "error: unavailable", "leader": False}
    for secret in ("10.1.2.3", "hunter2", "10.9.8.7", "ray-tok-123"):
        assert secret not in response.text
    # The operator still finds the detail in the log.
    logged = caplog.text
    assert "hunter2" in logged and "ray-tok-123" in logged


def test_compose_refuses_to_start_without_a_postgres_password():
    raw = yaml.safe_load((DEPLOY / "docker-compose.yaml").read_text())
    tokens = {"RAY_AUTH_TOKEN": "t" * 64, "ORCHESTRATOR_ADMIN_TOKEN": "a" * 40}
    with pytest.raises(KeyError, match="POSTGRES_PASSWORD"):
        _interpolate(raw, tokens)
    wired = _interpolate(raw, {**tokens, "POSTGRES_PASSWORD": "p" * 32})
    assert wired["services"]["postgres"]["environment"]["POSTGRES_PASSWORD"] == "p" * 32
    assert ":" + "p" * 32 + "@postgres:5432/" in wired["services"]["api"]["environment"]["ORCHESTRATOR_DATABASE_URL"]
