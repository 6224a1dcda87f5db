"""GET /v1/whoami and GET /v1/cluster over the fake cluster (SQLite and PostgreSQL)."""

from __future__ import annotations

import pytest

from orchestrator_contract.rest import ClusterStatus, WhoAmI
from tests.unit.api_helpers import ADMIN, auth, make_project, submit, tick


def test_whoami_names_the_key_and_its_project(client):
    project_id, keys = make_project(client, "vision")
    made = client.post(
        f"/v1/projects/{project_id}/keys", json={"role": "viewer", "name": "ci-bot"}, headers=auth(ADMIN)
    ).json()
    me = WhoAmI.model_validate(client.get("/v1/whoami", headers=auth(made["key"])).json())
    assert me == WhoAmI(
        key_id=made["id"],
        key_name="ci-bot",
        role="viewer",
        project_id=project_id,
        project_name="vision",
        cluster_admin=False,
        expires_at=None,
    )
    member = client.get("/v1/whoami", headers=auth(keys["member"])).json()
    assert (member["role"], member["project_name"], member["cluster_admin"]) == ("member", "vision", False)


def test_whoami_of_the_environment_admin_token(client):
    assert client.get("/v1/whoami", headers=auth(ADMIN)).json() == {
        "key_id": None,
        "key_name": None,
        "role": "admin",
        "project_id": None,
        "project_name": None,
        "cluster_admin": True,
        "expires_at": None,
    }


@pytest.mark.parametrize("route", ["/v1/whoami", "/v1/cluster"])
def test_they_need_a_key(client, route):
    assert client.get(route).status_code == 401
    assert client.get(route, headers=auth("ork_not-a-key")).status_code == 401


def _status(client, key) -> ClusterStatus:
    response = client.get("/v1/cluster", headers=auth(key))
    assert response.status_code == 200, response.text
    return ClusterStatus.model_validate(response.json())


def test_cluster_resources_counts_and_queue(app, client, backend):
    backend.total = {"CPU": 4.0, "GPU": 0.0}
    project_id, keys = make_project(client, "vision")
    empty = _status(client, keys["viewer"])
    assert (empty.ray, empty.total, empty.available) == ("ok", {"CPU": 4.0, "GPU": 0.0}, {"CPU": 4.0, "GPU": 0.0})
    assert set(empty.jobs) == {"QUEUED", "STARTING", "RUNNING", "RESTARTING", "CANCELLING", "SUCCEEDED", "FAILED",
                               "CANCELLED"}  # fmt: skip
    assert sum(empty.jobs.values()) == 0 and empty.queue == [] and empty.queue_limit >= 1

    running = submit(client, keys["member"], name="big", scaling={"num_workers": 3}).json()["id"]
    tick(app)  # admitted: it holds 3 CPU
    low = submit(client, keys["member"], name="low", priority=0).json()["id"]
    high = submit(client, keys["member"], name="high", priority=5).json()["id"]
    later = submit(client, keys["member"], name="later", priority=0).json()["id"]
    elsewhere = submit(client, ADMIN, name="other-project").json()["id"]
    tick(app)  # nothing else fits (2 CPU each, 1 free): each waits with a reason

    mine = _status(client, keys["viewer"])
    assert mine.available == {"CPU": 1.0, "GPU": 0.0}  # the scheduler's own reckoning: 4 less the 3 held
    assert mine.jobs["STARTING"] == 1 and mine.jobs["QUEUED"] == 3  # not the other project's job
    assert [q.id for q in mine.queue] == [high, low, later]  # admission order: priority, then age
    assert running not in {q.id for q in mine.queue}
    first = mine.queue[0]
    assert (first.name, first.priority, first.project_id, first.reason) == (
        "high",
        5,
        project_id,
        "insufficient_resources",
    )
    assert "needs 2 CPU, 1 free" in first.message

    everything = _status(client, ADMIN)  # a cluster-wide admin sees every project's
    assert everything.jobs["QUEUED"] == 4 and elsewhere in {q.id for q in everything.queue}


def test_the_queue_is_capped_but_counted(app, client, monkeypatch):
    from orchestrator.services import cluster_status

    monkeypatch.setattr(cluster_status, "QUEUE_LIMIT", 2)
    for i in range(3):
        assert submit(client, ADMIN, name=f"j{i}").status_code == 201  # queued: no scheduler tick here
    status = _status(client, ADMIN)
    assert status.jobs["QUEUED"] == 3 and [q.name for q in status.queue] == ["j0", "j1"] and status.queue_limit == 2


def test_a_cluster_that_does_not_answer_is_reported_not_a_500(client, backend):
    submit(client, ADMIN, name="waits")
    backend.available = False
    status = _status(client, ADMIN)
    assert (status.ray, status.total, status.available) == ("unavailable", {}, {})
    assert status.jobs["QUEUED"] == 1 and [q.name for q in status.queue] == ["waits"]
