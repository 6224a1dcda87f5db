"""A deployment's `url` is what a client outside the cluster calls: ORCHESTRATOR_SERVE_PUBLIC_URL (the Helm
chart sets it from serve.ingress.host or serve.publicUrl) plus the route, while Ray Serve itself keeps
listening where ORCHESTRATOR_SERVE_HOST and ORCHESTRATOR_SERVE_PORT say."""

from __future__ import annotations

import httpx
import pytest

from orchestrator.loops.serving import ServingReconciler
from orchestrator.settings import Settings
from tests.unit.api_helpers import ADMIN, auth
from tests.unit.test_deployments import finished_job

PUBLIC = "https://models.example.com"


def test_without_a_public_url_it_is_where_serve_listens():
    assert Settings().serve_url == "http://127.0.0.1:8001"  # `make run`: unchanged
    # Serve bound to every interface is still called on loopback from the same machine.
    assert Settings(serve_host="0.0.0.0", serve_port=8123).serve_url == "http://127.0.0.1:8123"
    assert Settings(serve_host="10.0.0.5").serve_url == "http://10.0.0.5:8001"


def test_the_public_url_comes_from_the_environment_without_a_trailing_slash(monkeypatch):
    monkeypatch.setenv("ORCHESTRATOR_SERVE_PUBLIC_URL", PUBLIC + "/")
    monkeypatch.setenv("ORCHESTRATOR_SERVE_HOST", "0.0.0.0")
    settings = Settings()
    assert settings.serve_url == PUBLIC
    assert (settings.serve_host, settings.serve_port) == ("0.0.0.0", 8001)


@pytest.fixture
def settings_overrides() -> dict:
    return {"serve_public_url": PUBLIC + "/", "serve_host": "0.0.0.0", "serve_port": 8123}


def test_every_answer_carries_the_public_url_and_serve_listens_where_it_did(live, tmp_path):
    job_id, _ = finished_job(live.app, tmp_path)
    with httpx.Client(base_url=live.url, headers=auth(ADMIN), timeout=10) as http:
        created = http.post("/v1/deployments", json={"name": "digits-pub", "source": {"job_id": job_id}})
        assert created.status_code == 201, created.text
        assert created.json()["url"] == f"{PUBLIC}/digits-pub"
        assert http.get("/v1/deployments/digits-pub").json()["url"] == f"{PUBLIC}/digits-pub"
        listed = http.get("/v1/deployments").json()
        assert [d["url"] for d in listed if d["name"] == "digits-pub"] == [f"{PUBLIC}/digits-pub"]

        service = live.app.state.service
        ServingReconciler(service.sessions, service.backend, service.settings).tick()
        # The public URL is only what clients are told: Serve is configured with the host and port it binds.
        assert live.backend.serve_applied[-1]["http_options"] == {"host": "0.0.0.0", "port": 8123}
        live.backend.serve_settle("digits-pub", "RUNNING")
        ServingReconciler(service.sessions, service.backend, service.settings).tick()
        healthy = http.get("/v1/deployments/digits-pub").json()
        assert healthy["state"] == "HEALTHY" and healthy["url"] == f"{PUBLIC}/digits-pub"
        assert f"serves at {PUBLIC}/digits-pub" in healthy["message"]
