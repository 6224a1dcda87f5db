"""``?name_prefix=`` on GET /v1/jobs and GET /v1/sweeps (SQLite and PostgreSQL): literal, case-sensitive,
scoped to the key's project, paged like every other filter, and bounded."""

from __future__ import annotations

from tests.unit.api_helpers import ADMIN, auth, make_project, submit
from tests.unit.test_sweeps import post_sweep

NAMES = ["resnet-a", "resnet-b", "resnet_c", "resnetXd", "res%net", "Resnet-e", "bert-1"]


def _job_names(client, key=ADMIN, **params) -> list[str]:
    response = client.get("/v1/jobs", params=params, headers=auth(key))
    assert response.status_code == 200, response.text
    return sorted(j["name"] for j in response.json()["items"])


def test_jobs_by_the_start_of_their_name(client):
    for name in NAMES:
        assert submit(client, ADMIN, name=name).status_code == 201
    assert _job_names(client, name_prefix="resnet") == ["resnet-a", "resnet-b", "resnetXd", "resnet_c"]
    assert _job_names(client, name_prefix="resnet-") == ["resnet-a", "resnet-b"]
    # LIKE's wildcards are plain characters here: "_" is no "any one character", "%" no "anything".
    assert _job_names(client, name_prefix="resnet_") == ["resnet_c"]
    assert _job_names(client, name_prefix="res%") == ["res%net"]
    assert _job_names(client, name_prefix="%") == []
    assert _job_names(client, name_prefix="Resnet") == ["Resnet-e"]  # case-sensitive, on SQLite too
    assert _job_names(client, name_prefix="nope") == []
    assert _job_names(client, name_prefix="") == sorted(NAMES)  # an empty prefix filters nothing
    # With the other filters, and paged: the cursor carries on within the filtered list.
    assert _job_names(client, name_prefix="resnet", state="QUEUED") == ["resnet-a", "resnet-b", "resnetXd", "resnet_c"]
    assert _job_names(client, name_prefix="resnet", state="RUNNING") == []
    first = client.get("/v1/jobs", params={"name_prefix": "resnet", "limit": 3}, headers=auth(ADMIN)).json()
    assert [j["name"] for j in first["items"]] == ["resnetXd", "resnet_c", "resnet-b"]  # newest first
    rest = client.get(
        "/v1/jobs", params={"name_prefix": "resnet", "limit": 3, "cursor": first["next_cursor"]}, headers=auth(ADMIN)
    ).json()
    assert [j["name"] for j in rest["items"]] == ["resnet-a"] and rest["next_cursor"] is None


def test_a_prefix_sees_only_the_keys_project(client):
    _, keys = make_project(client, "vision")
    assert submit(client, keys["member"], name="resnet-mine").status_code == 201
    assert submit(client, ADMIN, name="resnet-default").status_code == 201
    assert _job_names(client, keys["viewer"], name_prefix="resnet") == ["resnet-mine"]
    assert _job_names(client, ADMIN, name_prefix="resnet") == ["resnet-default", "resnet-mine"]  # cluster-wide


def test_a_prefix_longer_than_any_name_is_refused(client):
    for route in ("/v1/jobs", "/v1/sweeps"):
        assert client.get(route, params={"name_prefix": "x" * 128}, headers=auth(ADMIN)).status_code == 200
        response = client.get(route, params={"name_prefix": "x" * 129}, headers=auth(ADMIN))
        assert response.status_code == 422
        assert response.json()["detail"][0]["loc"] == ["query", "name_prefix"]


def test_sweeps_by_the_start_of_their_name(client):
    for name in ("lr-search", "lr_search", "wd-search"):
        assert post_sweep(client, name=name).status_code == 201
    names = lambda **p: sorted(  # noqa: E731
        s["name"] for s in client.get("/v1/sweeps", params=p, headers=auth(ADMIN)).json()
    )
    assert names(name_prefix="lr") == ["lr-search", "lr_search"]
    assert names(name_prefix="lr_") == ["lr_search"]
    assert names(name_prefix="wd", state="QUEUED") == ["wd-search"]
    assert names(name_prefix="wd", state="RUNNING") == []
    page = client.get("/v1/sweeps", params={"name_prefix": "lr", "limit": 1}, headers=auth(ADMIN))
    assert [s["name"] for s in page.json()] == ["lr_search"]
    rest = client.get(
        "/v1/sweeps", params={"name_prefix": "lr", "cursor": page.headers["X-Next-Cursor"]}, headers=auth(ADMIN)
    )
    assert [s["name"] for s in rest.json()] == ["lr-search"] and "X-Next-Cursor" not in rest.headers
