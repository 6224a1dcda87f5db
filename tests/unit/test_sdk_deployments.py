"""Deployments through the SDK over the live app and the fake Serve: create, wait, update, rollback, delete,
events; and ``predict`` against a tiny local HTTP server standing in for Serve's URL (the key sent only to a
deployment whose auth is ``project``)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from orchestrator.loops.serving import ServingReconciler
from orchestrator_client import Deployment, OrchestratorError, WaitTimeout
from tests.conftest import free_port
from tests.unit.api_helpers import ADMIN, driver_exits
from tests.unit.sdk_helpers import checkpoint, report, sdk, start, state


class ServeStub:
    """Answers every POST with ``{"predictions": ...}`` and records (path, Authorization, body)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.calls: list[tuple[str, str | None, object]] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # http.server's name for it
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stub.calls.append((self.path, self.headers.get("Authorization"), body))
                answer = json.dumps({"predictions": [len(row) for row in body["rows"]]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def serve_stub():
    stub = ServeStub()
    yield stub
    stub.server.shutdown()


@pytest.fixture
def settings_overrides(serve_stub) -> dict:
    return {"serve_port": serve_stub.port}


def finished_job(live, client) -> str:
    """A SUCCEEDED digits job with two epoch checkpoints whose folders hold a model."""
    job = client.jobs.submit({"workload": "digits", "config": {"hidden": 32}})
    token = start(live, job.id)
    events = [state("running")]
    for epoch, accuracy in ((1, 0.8), (2, 0.95)):
        event = checkpoint(live, job.id, epoch, 10 * epoch, val_accuracy=accuracy)
        Path(event["path"]).mkdir(parents=True)
        (Path(event["path"]) / "model.pt").write_bytes(b"weights")
        events.append(event)
    report(live, job.id, token, *events, state("succeeded"))
    driver_exits(live.app, live.backend, f"{job.id}-1")  # Ray confirms the reported end
    return job.id


def roll_out(live, name: str) -> None:
    """What the serving reconciler and Serve do: apply the config, Serve reports it running, promote."""
    service = live.app.state.service
    reconciler = ServingReconciler(service.sessions, service.backend, service.settings)
    reconciler.tick()
    live.backend.serve_settle(name, "RUNNING")
    reconciler.tick()


def test_create_wait_update_rollback_delete(live):
    client = sdk(live)
    job_id = finished_job(live, client)
    deployment = client.deployments.create({"name": "digits-a", "source": {"job_id": job_id}}, idempotency_key="d-1")
    assert isinstance(deployment, Deployment) and deployment.state == "DEPLOYING" and deployment.version == 1
    assert deployment.target.checkpoint["epoch"] == 2  # the best by val_accuracy
    # A retried create (its key sent again) answers the same deployment, not "name taken".
    again = client.deployments.create({"name": "digits-a", "source": {"job_id": job_id}}, idempotency_key="d-1")
    assert again.id == deployment.id
    with pytest.raises(OrchestratorError, match="name"):  # without the key: a second create of a taken name
        client.deployments.create({"name": "digits-a", "source": {"job_id": job_id}})

    rolling = threading.Timer(0.3, roll_out, (live, "digits-a"))
    rolling.start()
    try:
        assert deployment.wait(timeout=20, poll=0.05) is deployment
    finally:
        rolling.join()
    assert (deployment.state, deployment.serving_version) == ("HEALTHY", 1)

    deployment.update({"replicas": 2})
    assert deployment.version == 2 and deployment.target.settings["replicas"] == 2
    with pytest.raises(WaitTimeout) as timeout:  # nothing rolls it out: version 2 never serves
        deployment.wait(timeout=0.3, poll=0.05)
    assert timeout.value.last.serving_version == 1 and "version 2, serving 1" in str(timeout.value)
    roll_out(live, "digits-a")
    assert deployment.wait(timeout=5, poll=0.05).serving_version == 2

    deployment.rollback()
    assert deployment.version == 3 and deployment.target.settings["replicas"] == 1
    roll_out(live, "digits-a")
    assert client.deployments.get("digits-a").wait(timeout=5, poll=0.05).serving_version == 3

    assert [d.name for d in client.deployments.list()] == ["digits-a"]
    deployment.delete()
    assert deployment.state == "DELETED" and list(client.deployments.list()) == []
    assert [d.name for d in client.deployments.list(state="DELETED")] == ["digits-a"]
    events = [(e.to_state, e.version) for e in deployment.events()]
    assert events[0] == ("DEPLOYING", 1) and events[-1] == ("DELETED", 3)
    with pytest.raises(OrchestratorError) as deleted:
        deployment.update({"replicas": 1})
    assert deleted.value.status_code == 409


def test_predict_calls_the_url_with_the_key_only_when_auth_is_project(live, serve_stub):
    client = sdk(live)
    job_id = finished_job(live, client)
    guarded = client.deployments.create({"name": "guarded", "source": {"job_id": job_id}})
    assert guarded.predict({"rows": [[0.0] * 64, [1.0] * 64]}) == {"predictions": [64, 64]}
    assert serve_stub.calls[-1][:2] == ("/guarded", f"Bearer {ADMIN}")

    open_one = client.deployments.create({"name": "open", "source": {"job_id": job_id}, "auth": "none"})
    assert open_one.predict({"rows": [[0.0]]}) == {"predictions": [1]}
    assert serve_stub.calls[-1][:2] == ("/open", None)  # the key never leaves for a deployment that needs none
