"""Hole 6 (the body part): a request body past ORCHESTRATOR_MAX_BODY_MB (1 MB by default) is a 413 that
names the setting, before anything parses it: at once for a Content-Length that is too big, and as soon as
a chunked body (no Content-Length) grows past the cap."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from tests.security.test_run_tokens_and_checkpoint_paths import started_job
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


def _full_batch(attempt: int = 1) -> bytes:
    """1000 metric points (a driver's largest batch) of 60 names each: about 1.9 MB, past the public cap, within
    every input limit of a batch (``docs/security.md``, "Input limits")."""
    values = {f"metric_{k:02d}_of_a_long_name": 0.5 for k in range(60)}
    events = [{"type": "metrics", "epoch": 0, "step": step, "values": values} for step in range(1000)]
    return json.dumps({"attempt": attempt, "events": events}).encode()


def test_the_drivers_report_routes_have_their_own_larger_cap(app, client, backend):
    """A driver drops a batch refused with a 4xx, so its routes take a full batch of 1000 events.

    The check of a batch under the larger cap was ``!= 413`` (with a wrong token: a 422 then), which a 500, a
    401 or a 422 (a batch not applied at all) passed too. Shown once (a scratch test, not kept): with
    ``api.routers.internal.apply_events`` patched to raise, through a client that does not re-raise, the
    route answered 500, ``assert status != 413`` passed and the ``== 200`` here failed ("500"). The count of
    stored points fails any answer that did not apply the batch."""
    job, token = started_job(app, client, backend)
    headers = {**auth(token), "Content-Type": "application/json"}
    batch = _full_batch()
    assert MB < len(batch) < 16 * MB  # past the public routes' cap, within the drivers' routes'
    answer = client.post(f"/internal/v1/jobs/{job}/events", content=batch, headers=headers)
    assert answer.status_code == 200, answer.text[:300]
    points = client.get(f"/v1/jobs/{job}/metrics", params={"limit": 1000}, headers=auth(ADMIN))
    assert points.status_code == 200 and len(points.json()) == 1000
    huge = client.post(f"/internal/v1/jobs/{job}/events", content=_big_spec(17 * MB), headers=headers)
    assert huge.status_code == 413 and "ORCHESTRATOR_MAX_INTERNAL_BODY_MB (16 MB)" in huge.json()["detail"]
