"""The dashboard's deployment pages (/ui/deployments, /ui/deployments/{name or id}) and their JSON
(/ui/api/deployments...): versions and their source checkpoints, replicas, history, the rollback button (members,
CSRF), "try it" through the control plane (a real HTTP server stands in for Ray Serve), and project isolation
on every route."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from fastapi.testclient import TestClient

from orchestrator.loops.serving import ServingReconciler
from tests.conftest import free_port
from tests.unit.api_helpers import ADMIN, auth, make_project
from tests.unit.test_deployments import finished_job
from tests.unit.ui_helpers import csrf, signed_in

GOOD_KEY = "key-the-stub-accepts"


class FakeServe:
    """Ray Serve's HTTP proxy as far as "try it" sees it: answers /dep-a, which needs ``GOOD_KEY``."""

    def __init__(self, port: int):
        self.requests: list[dict] = []
        self.gate: threading.Event | None = None  # set: every answer waits for it
        calls = self.requests
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _answer(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length).decode() if length else ""
                calls.append(
                    {"method": self.command, "path": self.path, "auth": self.headers.get("Authorization"), "body": body}
                )
                if stub.gate is not None:
                    stub.gate.wait(10)
                if self.path != "/dep-a":
                    return self._answer(404, {"detail": "no route"})
                if self.headers.get("Authorization") != f"Bearer {GOOD_KEY}":
                    return self._answer(401, {"detail": "this deployment needs a key of its project"})
                if self.command == "GET":
                    return self._answer(200, {"expected": {"inputs": "rows of 64 numbers"}})
                return self._answer(200, {"predictions": [7], "version": 2, "deployment": "dep-a"})

            do_GET = do_POST = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


SERVE_PORT = free_port()


@pytest.fixture
def settings_overrides() -> dict:
    return {"serve_port": SERVE_PORT, "workload_packages": ""}


@pytest.fixture
def serve():
    stub = FakeServe(SERVE_PORT)
    yield stub
    stub.close()


def reconcile(app) -> None:
    service = app.state.service
    ServingReconciler(service.sessions, service.backend, service.settings).tick()


def healthy(app, backend, name: str) -> None:
    reconcile(app)
    backend.serve_settle(name, "RUNNING", replicas=2)
    reconcile(app)


@pytest.fixture
def two_projects(app, client, backend, tmp_path):
    """Project a with dep-a at version 2 (v1 then a settings change), healthy with 2 replicas; project b with
    dep-b."""
    a, a_keys = make_project(client, "a")
    b, b_keys = make_project(client, "b")
    job_a, _ = finished_job(app, tmp_path / "a", a)
    job_b, _ = finished_job(app, tmp_path / "b", b)
    made = client.post(
        "/v1/deployments", json={"name": "dep-a", "source": {"job_id": job_a}}, headers=auth(a_keys["member"])
    )
    assert made.status_code == 201, made.text
    healthy(app, backend, "dep-a")
    patched = client.patch("/v1/deployments/dep-a", json={"replicas": 2}, headers=auth(a_keys["member"]))
    assert patched.status_code == 200, patched.text
    healthy(app, backend, "dep-a")
    made_b = client.post(
        "/v1/deployments", json={"name": "dep-b", "source": {"job_id": job_b}}, headers=auth(b_keys["member"])
    )
    assert made_b.status_code == 201, made_b.text
    return {
        "a": {"id": a, "keys": a_keys, "job": job_a, "deployment": made.json()["id"]},
        "b": {"id": b, "keys": b_keys, "job": job_b, "deployment": made_b.json()["id"]},
    }


def user(app, key: str) -> TestClient:
    return signed_in(TestClient(app), key)


def test_the_deployment_page_shows_versions_replicas_and_history(app, two_projects):
    member = user(app, two_projects["a"]["keys"]["member"])
    for ref in ("dep-a", two_projects["a"]["deployment"]):  # by name or by id
        page = member.get(f"/ui/deployments/{ref}")
        assert page.status_code == 200, page.text
    html = page.text
    assert 'data-version="2"' in html and 'data-version="1"' in html
    assert f'href="/ui/jobs/{two_projects["a"]["job"]}"' in html  # the source checkpoint's job
    assert 'data-testid="serving"' in html and "dep-a-r0" in html and "dep-a-r1" in html
    assert 'id="rollback"' in html and "Roll back to v<span" in html
    assert 'id="try-form"' in html and 'id="try-key"' in html  # auth: project asks for a key
    assert "{&#34;inputs&#34;: [[0, 0, 5, 13" in html  # the digits example body
    assert 'id="history"' in html and "HEALTHY" in html
    data = member.get("/ui/api/deployments/dep-a").json()
    assert data["deployment"]["serving_version"] == 2 and data["can_roll_back"] is True
    assert [v["version"] for v in data["versions"]] == [2, 1]
    assert data["versions"][0]["origin"] == {
        "kind": "job",
        "label": f"job {two_projects['a']['job']}",
        "href": f"/ui/jobs/{two_projects['a']['job']}",
    }
    assert data["versions"][0]["epoch"] == 2 and data["versions"][0]["replicas_text"] == "2"  # best: 0.95
    assert [r["state"] for r in data["deployment"]["replicas"]] == ["RUNNING", "RUNNING"]
    assert data["events"][0]["to_state"] == "HEALTHY" and data["events"][-1]["from_state"] is None
    etag = member.get("/ui/api/deployments/dep-a").headers["ETag"]
    assert member.get("/ui/api/deployments/dep-a", headers={"If-None-Match": etag}).status_code == 304


def test_the_list_pages_and_its_state_filter(app, client, two_projects):
    member = user(app, two_projects["a"]["keys"]["member"])
    page = member.get("/ui/deployments")
    assert page.status_code == 200 and 'data-deployment-name="dep-a"' in page.text
    assert member.get("/ui/api/deployments").json()["items"][0]["replicas_running"] == 2
    assert client.delete("/v1/deployments/dep-a", headers=auth(two_projects["a"]["keys"]["member"])).status_code == 200
    assert 'data-deployment-name="dep-a"' not in member.get("/ui/deployments").text  # default: live ones
    deleted = member.get("/ui/deployments?state=DELETED")
    assert 'data-deployment-name="dep-a"' in deleted.text and 'value="DELETED" checked' in deleted.text
    assert "/ui/api/deployments?state=DELETED" in deleted.text
    assert [d["name"] for d in member.get("/ui/api/deployments?state=DELETED").json()["items"]] == ["dep-a"]
    gone = member.get("/ui/deployments/dep-a")
    assert gone.status_code == 200 and 'id="try-form"' not in gone.text and "was deleted" in gone.text
    assert member.get("/ui/api/deployments/dep-a").json()["can_roll_back"] is False
    assert member.get("/ui/api/deployments?state=NOPE").status_code == 422


def test_a_member_rolls_back_with_the_csrf_token(app, client, two_projects):
    member = user(app, two_projects["a"]["keys"]["member"])
    token = csrf(member, "/ui/deployments/dep-a")
    assert member.post("/ui/deployments/dep-a/rollback", follow_redirects=False).status_code == 403
    wrong = member.post("/ui/deployments/dep-a/rollback", data={"csrf_token": "nope" * 8}, follow_redirects=False)
    assert wrong.status_code == 403
    assert client.get("/v1/deployments/dep-a", headers=auth(ADMIN)).json()["version"] == 2
    done = member.post("/ui/deployments/dep-a/rollback", data={"csrf_token": token}, follow_redirects=False)
    assert done.status_code == 303 and done.headers["location"] == "/ui/deployments/dep-a"
    after = client.get("/v1/deployments/dep-a", headers=auth(ADMIN)).json()
    assert after["version"] == 3 and after["target"]["note"] == "rollback to version 1"
    assert after["state"] == "UPDATING" and after["serving_version"] == 2
    # dep-b has only version 1: nothing to roll back to, said on the page (409).
    b_member = user(app, two_projects["b"]["keys"]["member"])
    b_token = csrf(b_member, "/ui/deployments/dep-b")
    assert 'id="rollback-form"' in b_member.get("/ui/deployments/dep-b").text  # hidden until there is a v2
    refused = b_member.post("/ui/deployments/dep-b/rollback", data={"csrf_token": b_token})
    assert refused.status_code == 409 and "nothing to roll back to" in refused.text


def test_a_viewer_sees_no_rollback_button_and_is_refused(app, client, two_projects):
    viewer = user(app, two_projects["a"]["keys"]["viewer"])
    page = viewer.get("/ui/deployments/dep-a")
    assert page.status_code == 200 and 'id="rollback"' not in page.text and 'id="rollback-form"' not in page.text
    token = csrf(viewer, "/ui/deployments/dep-a")
    refused = viewer.post("/ui/deployments/dep-a/rollback", data={"csrf_token": token}, follow_redirects=False)
    assert refused.status_code == 403 and "read-only" in refused.text
    assert client.get("/v1/deployments/dep-a", headers=auth(ADMIN)).json()["version"] == 2


def test_try_it_sends_the_request_to_the_deployment_and_shows_its_answer(app, two_projects, serve):
    viewer = user(app, two_projects["a"]["keys"]["viewer"])  # it changes nothing: a viewer may try
    token = csrf(viewer, "/ui/deployments/dep-a")
    url = "/ui/api/deployments/dep-a/try"
    body = {"method": "POST", "body": '{"inputs": [[0, 1]]}', "key": GOOD_KEY}
    assert viewer.post(url, json=body).status_code == 403  # no CSRF header
    answer = viewer.post(url, json=body, headers={"X-CSRF-Token": token})
    assert answer.status_code == 200, answer.text
    result = answer.json()
    assert result["status"] == 200 and result["ok"] is True
    assert result["answer"] == {"predictions": [7], "version": 2, "deployment": "dep-a"}
    assert result["url"] == f"http://127.0.0.1:{SERVE_PORT}/dep-a"
    sent = serve.requests[-1]
    assert sent["method"] == "POST" and sent["path"] == "/dep-a" and sent["auth"] == f"Bearer {GOOD_KEY}"
    assert json.loads(sent["body"]) == {"inputs": [[0, 1]]}
    # The deployment's own refusal comes back as it came: status and detail.
    no_key = viewer.post(url, json={**body, "key": ""}, headers={"X-CSRF-Token": token}).json()
    assert no_key["status"] == 401 and no_key["ok"] is False and "needs a key" in no_key["answer"]["detail"]
    assert serve.requests[-1]["auth"] is None
    described = viewer.post(url, json={"method": "GET", "key": GOOD_KEY}, headers={"X-CSRF-Token": token}).json()
    assert described["status"] == 200 and described["answer"]["expected"]
    # A body that is not JSON never leaves the control plane.
    count = len(serve.requests)
    bad = viewer.post(url, json={**body, "body": "{nope"}, headers={"X-CSRF-Token": token})
    assert bad.status_code == 422 and "not JSON" in bad.json()["detail"]
    assert len(serve.requests) == count


def test_try_it_requests_in_flight_are_bounded_per_key(app, two_projects, serve):
    """A slow deployment holds a worker thread per request: a key gets 2 at once, the third is a 429 saying so."""
    viewer = user(app, two_projects["a"]["keys"]["viewer"])
    member = user(app, two_projects["a"]["keys"]["member"])
    headers = {"X-CSRF-Token": csrf(viewer, "/ui/deployments/dep-a")}
    body = {"body": "{}", "key": GOOD_KEY}
    serve.gate = threading.Event()
    statuses: list[int] = []

    def call() -> None:
        statuses.append(viewer.post("/ui/api/deployments/dep-a/try", json=body, headers=headers).status_code)

    callers = [threading.Thread(target=call) for _ in range(2)]
    for caller in callers:
        caller.start()
    deadline = time.monotonic() + 10
    while len(serve.requests) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    third = viewer.post("/ui/api/deployments/dep-a/try", json=body, headers=headers)
    assert third.status_code == 429 and "at most 2 try-it requests of one key" in third.json()["detail"]
    member_headers = {"X-CSRF-Token": csrf(member, "/ui/deployments/dep-a")}
    other_key: list[int] = []
    another = threading.Thread(
        target=lambda: other_key.append(
            member.post("/ui/api/deployments/dep-a/try", json=body, headers=member_headers).status_code
        )
    )
    another.start()
    while len(serve.requests) < 3 and time.monotonic() < deadline:  # another key has slots of its own
        time.sleep(0.02)
    assert len(serve.requests) == 3
    serve.gate.set()
    for caller in [*callers, another]:
        caller.join(10)
    assert statuses == [200, 200] and other_key == [200]
    assert viewer.post("/ui/api/deployments/dep-a/try", json=body, headers=headers).status_code == 200


def test_try_it_says_plainly_when_the_deployment_cannot_be_reached(app, two_projects):
    member = user(app, two_projects["a"]["keys"]["member"])  # no server listens on the Serve port
    token = csrf(member, "/ui/deployments/dep-a")
    answer = member.post("/ui/api/deployments/dep-a/try", json={"body": "{}"}, headers={"X-CSRF-Token": token})
    assert answer.status_code == 502
    assert answer.json()["detail"].startswith(f"could not reach the deployment at http://127.0.0.1:{SERVE_PORT}/dep-a")


def test_another_projects_deployments_are_not_found_anywhere(app, client, two_projects, serve):
    b_id = two_projects["b"]["deployment"]
    for role in ("member", "viewer"):
        a_user = user(app, two_projects["a"]["keys"][role])
        assert "dep-b" not in a_user.get("/ui/deployments").text
        assert "dep-b" not in a_user.get("/ui/deployments?state=DEPLOYING").text
        listed = a_user.get("/ui/api/deployments").json()["items"]
        assert [d["name"] for d in listed] == ["dep-a"]
        for ref in ("dep-b", b_id):
            page = a_user.get(f"/ui/deployments/{ref}")
            assert page.status_code == 404 and "dep-b" not in page.text.replace(f"no deployment {ref}", "")
            assert a_user.get(f"/ui/api/deployments/{ref}").status_code == 404
        token = csrf(a_user, "/ui/deployments")
        rollback = a_user.post("/ui/deployments/dep-b/rollback", data={"csrf_token": token})
        assert rollback.status_code == (404 if role == "member" else 403)
        tried = a_user.post(
            "/ui/api/deployments/dep-b/try", json={"body": "{}", "key": GOOD_KEY}, headers={"X-CSRF-Token": token}
        )
        assert tried.status_code == 404
    assert not [r for r in serve.requests if r["path"] == "/dep-b"]
    assert client.get("/v1/deployments/dep-b", headers=auth(ADMIN)).json()["version"] == 1
    admin = user(app, ADMIN)
    assert {d["name"] for d in admin.get("/ui/api/deployments").json()["items"]} == {"dep-a", "dep-b"}
    assert admin.get("/ui/deployments/dep-b").status_code == 200


def test_without_a_session_the_pages_redirect_and_the_json_is_401(app, two_projects):
    anonymous = TestClient(app)
    for path in ("/ui/deployments", "/ui/deployments/dep-a"):
        answer = anonymous.get(path, follow_redirects=False)
        assert answer.status_code == 303 and answer.headers["location"].startswith("/ui/login?next=")
    for path in ("/ui/api/deployments", "/ui/api/deployments/dep-a"):
        assert anonymous.get(path).status_code == 401
    assert anonymous.post("/ui/api/deployments/dep-a/try", json={"body": "{}"}).status_code == 401
