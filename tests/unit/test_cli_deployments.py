"""``orch deployments`` against the unit-test app over real HTTP, Ray Serve played by the fake backend and a
little HTTP server on Serve's port (for ``predict``)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from orchestrator.loops.serving import ServingReconciler
from tests.conftest import free_port
from tests.unit.cli_support import orch
from tests.unit.test_deployments import finished_job

SERVE_PORT = free_port()


@pytest.fixture
def settings_overrides() -> dict:
    return {"serve_port": SERVE_PORT}


@pytest.fixture(autouse=True)
def _own_config(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))


@pytest.fixture
def serve():
    """Serve's HTTP proxy, as far as predict needs: echoes the path, the body and the Authorization header."""

    class Echo(BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            answer = json.dumps({"path": self.path, "got": body, "auth": self.headers.get("Authorization")}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", SERVE_PORT), Echo)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield
    server.shutdown()


def _settle(live, name: str) -> None:
    service = live.app.state.service
    ServingReconciler(service.sessions, service.backend, service.settings).tick()
    live.backend.serve_settle(name, "RUNNING")
    ServingReconciler(service.sessions, service.backend, service.settings).tick()


def test_every_deployment_command(live, tmp_path, serve):
    job_id, checkpoint_ids = finished_job(live.app, tmp_path)
    spec = tmp_path / "deployment.yaml"
    spec.write_text(f"name: digits\nsource:\n  job_id: {job_id}\n")
    created = orch(live, "deployments", "create", "-f", str(spec), "-o", "json")
    assert created.exit_code == 0, created.output
    body = json.loads(created.stdout)
    assert body["name"] == "digits" and body["state"] == "DEPLOYING" and {"url", "versions", "target"} <= body.keys()
    _settle(live, "digits")

    assert "HEALTHY" in orch(live, "deployments", "get", "digits").stdout
    listed = orch(live, "deployments", "list", "-o", "json")
    assert [d["name"] for d in json.loads(listed.stdout)] == ["digits"]
    assert "digits" in orch(live, "deployments", "list").stdout

    updated = orch(
        live, "deployments", "update", "digits", "--set", f"source.checkpoint_id={checkpoint_ids[0]}", "-o", "json"
    )
    assert updated.exit_code == 0, updated.output
    assert json.loads(updated.stdout)["version"] == 2
    _settle(live, "digits")
    rolled = orch(live, "deployments", "rollback", "digits", "-o", "json")
    assert rolled.exit_code == 0 and json.loads(rolled.stdout)["version"] == 3
    events = json.loads(orch(live, "deployments", "events", "digits", "-o", "json").stdout)
    assert events[0]["to_state"] == "DEPLOYING" and "HEALTHY" in [e["to_state"] for e in events]

    payload = tmp_path / "x.json"
    payload.write_text('{"inputs": [[0, 1]]}')
    answer = orch(live, "deployments", "predict", "digits", "-d", f"@{payload}")
    assert answer.exit_code == 0, answer.output
    echoed = json.loads(answer.stdout)
    assert echoed["got"] == {"inputs": [[0, 1]]} and echoed["path"].startswith("/digits")
    inline = orch(live, "deployments", "predict", "digits", "-d", '{"inputs": []}')
    assert json.loads(inline.stdout)["got"] == {"inputs": []}
    assert orch(live, "deployments", "predict", "digits", "-d", "{not json").exit_code == 2

    assert orch(live, "deployments", "delete", "digits").exit_code == 2  # no terminal: -y needed
    deleted = orch(live, "deployments", "delete", "digits", "-y", "-o", "json")
    assert deleted.exit_code == 0 and json.loads(deleted.stdout)["state"] == "DELETED"


def test_a_bad_deployment_is_422_at_its_line(live, tmp_path):
    spec = tmp_path / "deployment.yaml"
    spec.write_text("name: Not_A_Name\nsource:\n  job_id: nope\nreplicas: 0\n")
    result = orch(live, "deployments", "create", "-f", str(spec))
    assert result.exit_code == 2
    assert f"{spec}:1: name:" in result.stderr or f"{spec}:4: replicas:" in result.stderr, result.stderr
    assert orch(live, "deployments", "get", "nothing").exit_code == 2
    assert orch(live, "deployments", "create").exit_code == 2  # neither -f nor --set
