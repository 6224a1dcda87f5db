"""The Ray backend's log tail (``RayBackend.tail_logs``, what a follow reads while Ray has the run) against a
stub of Ray's dashboard that speaks its websocket route as Ray 2.60's ``job_head.py`` does, and the batching
rule of Ray's agent it relies on to know when a tail has reached the end of what was printed."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from orchestrator.backend import BackendUnavailable, LogChunk, RunNotFound, ray_backend
from orchestrator.backend.ray_backend import RayBackend

SUBMISSION = "0a404b-1"


def lines(first: int, count: int) -> str:
    return "".join(f"line {i}\n" for i in range(first, first + count))


async def stub_dashboard(script: list | int):
    """A dashboard whose tail route sends ``script`` (texts, and numbers: seconds to wait) then closes, or
    answers ``script`` when it is an HTTP status. Returns (url, runner)."""

    async def version(request):
        return web.json_response({"version": "4", "ray_version": "2.60.0", "ray_commit": "x"})

    async def tail(request):
        if isinstance(script, int):
            return web.Response(status=script, text=f"Job {request.match_info['job']} does not exist")
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        for step in script:
            if isinstance(step, str):
                await ws.send_str(step)
            else:
                await asyncio.sleep(step)
        await ws.close()
        return ws

    app = web.Application()
    app.router.add_get("/api/version", version)
    app.router.add_get("/api/jobs/{job}/logs/tail", tail)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    return f"http://127.0.0.1:{port}", runner


async def tail_of(script: list | int) -> list[LogChunk]:
    url, runner = await stub_dashboard(script)
    try:
        return [chunk async for chunk in RayBackend(url, token="t").tail_logs(SUBMISSION)]
    finally:
        await runner.cleanup()


def test_a_tail_says_when_it_reached_the_end_of_what_was_printed(monkeypatch):
    # Ray's agent sends batches of 10 lines until the end of the file, where the batch is cut short; then,
    # as the driver prints more, what it printed. A batch of exactly 10 lines at the end is only known to
    # be the end when nothing follows it for a while (Ray's agent waits a second at the end: 2 s; 0.5 here).
    monkeypatch.setattr(ray_backend, "_TAIL_QUIET_S", 0.5)
    script = [0.8, lines(0, 10), lines(10, 10), lines(20, 3), 0.8, lines(23, 10), 0.8, lines(33, 1)]
    chunks = asyncio.run(tail_of(script))
    assert chunks == [  # nothing said during the wait for the first batch: the driver had printed nothing
        LogChunk(lines(0, 10), at_end=False),
        LogChunk(lines(10, 10), at_end=False),
        LogChunk(lines(20, 3), at_end=True),
        LogChunk(lines(23, 10), at_end=False),
        LogChunk("", at_end=True),  # a quiet second after a full batch: the end
        LogChunk(lines(33, 1), at_end=True),
    ]


def test_rays_404_is_no_such_run_and_other_failures_are_unavailable():
    with pytest.raises(RunNotFound):
        asyncio.run(tail_of(404))
    for status in (500, 502, 401):
        with pytest.raises(BackendUnavailable):
            asyncio.run(tail_of(status))

    async def nobody_there():
        url, runner = await stub_dashboard([])
        await runner.cleanup()
        return [chunk async for chunk in RayBackend(url).tail_logs(SUBMISSION)]

    with pytest.raises(BackendUnavailable):
        asyncio.run(nobody_there())


def test_the_batching_of_rays_agent_is_what_the_backend_reads(tmp_path):
    """Ray's own ``file_tail_iterator`` (what its agent sends a tail from): batches of 10 lines, a longer text
    cut past 20,000 characters, and a batch cut short only by the end of the file (fails by name when a Ray
    upgrade changes it; a tail would then say it is at the end only after a quiet second)."""
    from ray.dashboard.modules.job.utils import file_tail_iterator

    path = tmp_path / "job-driver.log"
    path.write_text(lines(0, 23) + "x" * 30_000 + "\n" + "partial")

    async def batches() -> list[str]:
        found = []
        async for batch in file_tail_iterator(str(path)):
            if batch is None:
                return found
            found.append("".join(batch))
        return found

    sent = asyncio.run(batches())
    assert sent == [lines(0, 10), lines(10, 10), lines(20, 3) + "x" * 30_000 + "\n", "partial"]
    at_end = [
        text.count("\n") < ray_backend._TAIL_BATCH_LINES and len(text) <= ray_backend._TAIL_BATCH_CHARS for text in sent
    ]
    assert at_end == [False, False, False, True]
