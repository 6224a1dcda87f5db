"""Hole 6 (the body part): a request body past ORCHESTRATOR_MAX_BODY_MB (1 MB by default) is a 413 that
names the setting, before anything parses it: at once for a Content-Length that is too big, and as soon as
a chunked body (no Content-Length) grows past the cap."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from tests.unit.api_helpers import ADMIN, auth, count_jobs

MB = 1024 * 1024
CHUNK = 64 * 1024


def _post(app, body_chunks, headers: dict[str, str]) -> tuple[httpx.Response, int]:
    """POST /v1/jobs through the ASGI app with a streamed body; returns the answer and the chunks read."""
    pulled = 0

    async def body():
        nonlocal pulled
        for chunk in body_chunks:
            pulled += 1
            yield chunk

    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.post("/v1/jobs", content=body(), headers={**auth(ADMIN), **headers})

    return asyncio.run(go()), pulled


def _big_spec(size: int) -> bytes:
    # Well-formed JSON: without a cap it is parsed whole (and then refused by validation, 422).
    return json.dumps({"workload": "digits", "labels": {"x": "y" * size}}).encode()


def _chunks(data: bytes) -> list[bytes]:
    return [data[i : i + CHUNK] for i in range(0, len(data), CHUNK)]


def _says_the_limit(response: httpx.Response) -> None:
    assert response.status_code == 413, response.text[:300]
    detail = response.json()["detail"]
    assert "ORCHESTRATOR_MAX_BODY_MB" in detail and "1 MB" in detail, detail


def test_a_content_length_past_the_cap_is_413_before_a_byte_is_read(app):
    body = _big_spec(20 * MB)
    response, pulled = _post(app, _chunks(body), {"Content-Length": str(len(body)), "Content-Type": "application/json"})
    _says_the_limit(response)
    assert pulled == 0
    assert count_jobs(app) == 0


def test_a_chunked_body_is_cut_off_when_it_grows_past_the_cap(app):
    body = _big_spec(20 * MB)
    response, pulled = _post(app, _chunks(body), {"Content-Type": "application/json"})
    _says_the_limit(response)
    assert pulled <= MB // CHUNK + 1  # read no further than the cap
    assert count_jobs(app) == 0


def test_a_body_under_the_cap_is_served(app, client):
    spec = json.dumps({"workload": "digits", "name": "n" * 100}).encode()
    response, _ = _post(app, [spec], {"Content-Type": "application/json"})
    assert response.status_code == 201, response.text[:300]
    near = client.post(
        "/v1/jobs", content=_big_spec(MB - 1000), headers={**auth(ADMIN), "Content-Type": "application/json"}
    )
    assert near.status_code == 422, near.text[:300]  # parsed: refused by validation (labels), not by the cap


@pytest.mark.parametrize("settings_overrides", [{"max_body_mb": 0.01}])
def test_the_cap_is_a_setting(app, client):
    small = client.post(
        "/v1/jobs", content=_big_spec(20_000), headers={**auth(ADMIN), "Content-Type": "application/json"}
    )
    assert small.status_code == 413, small.text[:300]
    assert "ORCHESTRATOR_MAX_BODY_MB (0.01 MB)" in small.json()["detail"]


def test_the_drivers_report_routes_have_their_own_larger_cap(client):
    # A driver drops a batch refused with a 4xx, so its routes take a full batch of 1000 events.
    headers = {**auth("not-a-job-token"), "Content-Type": "application/json"}
    batch = client.post("/internal/v1/jobs/x/events", content=_big_spec(2 * MB), headers=headers)
    assert batch.status_code != 413, batch.text[:300]
    huge = client.post("/internal/v1/jobs/x/events", content=_big_spec(17 * MB), headers=headers)
    assert huge.status_code == 413 and "ORCHESTRATOR_MAX_INTERNAL_BODY_MB (16 MB)" in huge.json()["detail"]
