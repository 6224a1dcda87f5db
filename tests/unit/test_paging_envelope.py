"""One paging scheme for every list (docs/getting-started.md, "Paging"): ``?envelope=true`` answers
``{"items", "next_cursor"}`` (50 a page by default), the cursor also in ``X-Next-Cursor``; without it a list
answers the bare list it always did, now with a ``Deprecation`` header; ``GET /v1/jobs`` is the envelope always."""

from __future__ import annotations

import pytest

from tests.unit.api_helpers import ADMIN, auth, make_project

LISTS = [
    "/v1/jobs",
    "/v1/jobs/{job}/events",
    "/v1/jobs/{job}/metrics",
    "/v1/jobs/{job}/checkpoints",
    "/v1/sweeps",
    "/v1/sweeps/{sweep}/trials",
    "/v1/sweeps/{sweep}/events",
    "/v1/deployments",
    "/v1/projects",
    "/v1/projects/{project}/keys",
    "/v1/code",
]
SWEEP = {
    "base": {"workload": "digits", "epochs": 2, "scaling": {"num_workers": 1, "cpus_per_worker": 0.5}},
    "search_space": {"lr.base": {"type": "loguniform", "low": 1e-3, "high": 0.3}},
}


def test_every_list_route_offers_the_envelope(app):
    """A list route added later must page the same way: every route that takes a cursor takes ``envelope``."""
    listed = []
    for path, operations in app.openapi()["paths"].items():
        names = {p["name"] for p in operations.get("get", {}).get("parameters", [])}
        if "cursor" in names:
            listed.append(path)
            assert "envelope" in names, f"GET {path} pages without the envelope (use api.paging.Page)"
    assert len(listed) >= len(LISTS) and "/v1/trials/{trial_id}/metrics" in listed


@pytest.fixture
def ids(client):
    job = client.post("/v1/jobs", json={"workload": "digits"}, headers=auth(ADMIN)).json()["id"]
    client.post(f"/v1/jobs/{job}/cancel", headers=auth(ADMIN))  # two events: QUEUED, CANCELLED
    sweep = client.post("/v1/sweeps", json=SWEEP, headers=auth(ADMIN)).json()["id"]
    project, _ = make_project(client, "paged")
    return {"job": job, "sweep": sweep, "project": project}


@pytest.mark.parametrize("route", LISTS)
def test_the_envelope_and_the_deprecated_bare_list_hold_the_same_items(client, ids, route):
    path = route.format(**ids)
    bare = client.get(path, headers=auth(ADMIN))
    assert bare.status_code == 200, bare.text
    wrapped = client.get(path, params={"envelope": "true"}, headers=auth(ADMIN))
    assert wrapped.status_code == 200, wrapped.text
    page = wrapped.json()
    assert set(page) == {"items", "next_cursor"} and page["next_cursor"] is None
    assert "Deprecation" not in wrapped.headers
    if route == "/v1/jobs":  # the envelope since the start: nothing deprecated
        assert bare.json() == page and "Deprecation" not in bare.headers
    else:
        assert bare.json() == page["items"] and bare.headers["Deprecation"] == "@1795824000"


@pytest.mark.parametrize("route", ["/v1/jobs/{job}/events", "/v1/projects/{project}/keys"])
def test_the_envelope_pages_by_its_cursor(client, ids, route):
    path = route.format(**ids)
    everything = client.get(path, params={"envelope": "true"}, headers=auth(ADMIN)).json()["items"]
    assert len(everything) >= 2
    seen, cursor = [], None
    while True:
        answer = client.get(path, params={"envelope": "true", "limit": 1, "cursor": cursor}, headers=auth(ADMIN))
        page = answer.json()
        assert len(page["items"]) == 1 and answer.headers.get("X-Next-Cursor") == page["next_cursor"]
        seen += page["items"]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == everything


def test_the_envelope_is_50_a_page_by_default_and_the_bare_list_200(client):
    for i in range(51):
        assert client.post("/v1/projects", json={"name": f"p{i:02d}"}, headers=auth(ADMIN)).status_code == 201
    page = client.get("/v1/projects", params={"envelope": "true"}, headers=auth(ADMIN)).json()
    assert len(page["items"]) == 50 and page["next_cursor"]
    assert len(client.get("/v1/projects", headers=auth(ADMIN)).json()) > 50
