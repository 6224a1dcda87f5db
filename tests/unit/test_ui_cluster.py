"""The dashboard's cluster page (/ui/cluster) and its JSON (/ui/api/cluster): nodes, CPUs/GPUs used and free,
and the queue with why each job waits; a project's users see only their project's queue."""

from __future__ import annotations

import re

from fastapi.testclient import TestClient

from tests.unit.api_helpers import ADMIN, auth, blame_node, make_project, submit, tick
from tests.unit.ui_helpers import csrf, signed_in

FOUR_CPUS = {"scaling": {"num_workers": 2, "cpus_per_worker": 2}}  # the fake cluster's whole 4 CPUs
SWEEP = {
    "name": "queued-b",
    "base": {"workload": "digits", "epochs": 2, "scaling": {"num_workers": 1, "cpus_per_worker": 1}},
    "search_space": {"lr.base": {"type": "choice", "values": [0.1, 0.01]}},
}


def user(app, key: str) -> TestClient:
    return signed_in(TestClient(app), key)


def queue_of(app, client):
    """Project a: one running job (all 4 CPUs) and one waiting; project b: one waiting job and a queued sweep."""
    _a, a_keys = make_project(client, "a")
    _b, b_keys = make_project(client, "b")
    running = submit(client, a_keys["member"], name="a-running", **FOUR_CPUS).json()["id"]
    tick(app)
    waiting_a = submit(client, a_keys["member"], name="a-waits", **FOUR_CPUS).json()["id"]
    waiting_b = submit(client, b_keys["member"], name="b-waits", **FOUR_CPUS).json()["id"]
    sweep_b = client.post("/v1/sweeps", json=SWEEP, headers=auth(b_keys["member"]))
    assert sweep_b.status_code == 201, sweep_b.text
    tick(app)
    return {
        "a": a_keys,
        "b": b_keys,
        "running": running,
        "waiting_a": waiting_a,
        "waiting_b": waiting_b,
        "sweep_b": sweep_b.json()["id"],
    }


def test_the_cluster_page_shows_nodes_resources_and_the_queue_with_reasons(app, client):
    q = queue_of(app, client)
    member = user(app, q["a"]["member"])
    page = member.get("/ui/cluster")
    assert page.status_code == 200, page.text
    html = page.text
    assert 'data-node-id="fake-head"' in html and "head" in html
    cpu = re.search(r'<tr data-resource="CPU">(.*?)</tr>', html, re.S).group(1)
    assert re.findall(r'data-field="(\w+)">([\d.]+)<', cpu) == [("total", "4"), ("used", "4"), ("free", "0")]
    assert f'data-job-id="{q["waiting_a"]}"' in html
    job = client.get(f"/v1/jobs/{q['waiting_a']}", headers=auth(ADMIN)).json()
    assert job["state"] == "QUEUED" and job["reason"] and job["message"]
    assert job["message"] in html and f"<code>{job['reason']}</code>" in html  # why it waits, as the API says
    assert 'id="ray-unavailable" class="error hidden"' in html
    data = member.get("/ui/api/cluster").json()
    assert data["ray"] == "ok" and data["all_projects"] is False
    assert {r["name"]: (r["total"], r["used"], r["free"]) for r in data["resources"]} == {
        "CPU": (4.0, 4.0, 0.0),
        "GPU": (0.0, 0.0, 0.0),
    }
    assert data["nodes"] == [
        {
            "cluster": "local",
            "node_id": "fake-head",
            "address": "127.0.0.1",
            "is_head": True,
            "total": {"CPU": 4.0, "GPU": 0.0},
            "kept_out": None,
            "faults": 0,
        }
    ]
    assert [(j["id"], j["reason"], j["message"]) for j in data["queue"]] == [
        (q["waiting_a"], job["reason"], job["message"])
    ]
    assert data["jobs"]["QUEUED"] == 1 and data["jobs"]["STARTING"] == 1
    etag = member.get("/ui/api/cluster").headers["ETag"]
    assert member.get("/ui/api/cluster", headers={"If-None-Match": etag}).status_code == 304


def test_a_project_sees_only_its_own_queue_and_an_admin_sees_every_one(app, client):
    q = queue_of(app, client)
    for role in ("member", "viewer"):
        a_user = user(app, q["a"][role])
        html = a_user.get("/ui/cluster").text
        assert q["waiting_b"] not in html and "b-waits" not in html and q["sweep_b"] not in html
        assert "Other projects' queued jobs are not listed" in html
        data = a_user.get("/ui/api/cluster").json()
        assert [j["id"] for j in data["queue"]] == [q["waiting_a"]]
        assert data["queued_sweeps"] == [] and sum(data["jobs"].values()) == 2
    b_data = user(app, q["b"]["viewer"]).get("/ui/api/cluster").json()
    assert [j["id"] for j in b_data["queue"]] == [q["waiting_b"]]
    assert [s["id"] for s in b_data["queued_sweeps"]] == [q["sweep_b"]]
    admin = user(app, ADMIN)
    data = admin.get("/ui/api/cluster").json()
    assert data["all_projects"] is True
    assert {j["id"] for j in data["queue"]} == {q["waiting_a"], q["waiting_b"]}
    assert [s["id"] for s in data["queued_sweeps"]] == [q["sweep_b"]]
    html = admin.get("/ui/cluster").text
    assert q["waiting_b"] in html and "<th>Project</th>" in html
    # An admin who chose project b in the top bar sees b's queue only.
    b_id = client.get(f"/v1/jobs/{q['waiting_b']}", headers=auth(ADMIN)).json()["project_id"]
    switched = admin.post(
        "/ui/project",
        data={"project_id": b_id, "csrf_token": csrf(admin, "/ui/cluster"), "next": "/ui/cluster"},
        follow_redirects=False,
    )
    assert switched.status_code == 303
    data = admin.get("/ui/api/cluster").json()
    assert data["all_projects"] is False and [j["id"] for j in data["queue"]] == [q["waiting_b"]]


def test_a_cluster_that_does_not_answer_is_said_plainly(app, client, backend):
    q = queue_of(app, client)
    backend.available = False
    member = user(app, q["a"]["member"])
    page = member.get("/ui/cluster")
    assert page.status_code == 200
    assert 'id="ray-unavailable" class="error "' in page.text and "The Ray cluster does not answer" in page.text
    data = member.get("/ui/api/cluster").json()
    assert data["ray"] == "unavailable" and data["nodes"] == []
    assert [j["id"] for j in data["queue"]] == [q["waiting_a"]]  # the queue is the database's


def test_without_a_session_the_page_redirects_and_the_json_is_401(app):
    anonymous = TestClient(app)
    answer = anonymous.get("/ui/cluster", follow_redirects=False)
    assert answer.status_code == 303 and answer.headers["location"] == "/ui/login?next=/ui/cluster"
    assert anonymous.get("/ui/api/cluster").status_code == 401


def test_a_bad_node_says_it_is_kept_out_until_when(app, client, backend):
    backend.node_ids = ["fake-head", "node-a"]
    blame_node(app.state.service.sessions, "node-a", "j" * 32)
    member = user(app, make_project(client, "a")[1]["member"])
    html = member.get("/ui/cluster").text
    row = re.search(r'<tr data-node-id="node-a">(.*?)</tr>', html, re.S).group(1)
    assert re.search(r"kept out until <time datetime=\"[^\"]+\">[\d-]+ [\d:]+</time> \(2 hangs or stragglers\)", row)
    head = re.search(r'<tr data-node-id="fake-head">(.*?)</tr>', html, re.S).group(1)
    assert "placed on" in head and "kept out" not in head
    nodes = {n["node_id"]: n for n in member.get("/ui/api/cluster").json()["nodes"]}
    assert nodes["node-a"]["faults"] == 2 and nodes["node-a"]["kept_out"] and nodes["fake-head"]["kept_out"] is None
