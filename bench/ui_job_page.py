"""The dashboard's job page with 100,000 metric points (docs/dashboard.md): how long the page and its curves take to
load, against the plain REST read of the same job's metrics, side by side in one run.

    .venv/bin/python bench/ui_job_page.py                        # SQLite in a temporary folder
    .venv/bin/python bench/ui_job_page.py --database-url postgresql+psycopg://postgres@127.0.0.1:5432/orch_ui_bench

One job with ``--points`` metric points (train_loss every step, val_accuracy and val_loss once an epoch of
``--steps-per-epoch`` steps, samples_per_s every 10 steps; two attempts, the second resuming 5 % before the
first stopped), 10 checkpoints and 30 events. The service (``create_app``, loops off, a stand-in cluster) under
uvicorn in this process's thread, on loopback; the client is httpx, one request at a time, signed in to the
dashboard with a viewer key (the REST calls use the same key as a bearer token).

Measured, ``--rounds`` times each, alternating which goes first, median and min:

- **page**: what a browser fetches to show the job page and draw its curves: the HTML page, then (as its script
  does) the job's JSON and its metrics JSON (downsampled: at most 2,000 points a series, extremes kept), with
  the service's cache of downsampled curves emptied first, so every point is read (the first viewer);
- **page, cached**: the same for a second viewer (or a reload) while no point was added: the curves come from
  the cache of answers by ETag;
- **reference**: the REST API's read of the same points, ``GET /v1/jobs/{id}/metrics`` page by page at its
  largest page (1,000), as a client that draws the curves itself must;
- **poll**: a live update of the curves when nothing changed (If-None-Match, 304).

Prints the ratio page / reference (below 1: the page is faster than reading the points over REST).

``--browser``: also the time a real headless Chromium (Debian's, through Playwright's ``executable_path``;
ORCHESTRATOR_CHROMIUM or the first on PATH) takes from starting to load the page to every curve drawn, with
the curves' cache emptied first, median of ``--rounds``.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import uvicorn  # noqa: E402
from sqlalchemy import insert  # noqa: E402

from api.app import create_app  # noqa: E402
from api.ui.jobs_api import CHARTS  # noqa: E402
from orchestrator.db.models import Checkpoint, JobMetric, JobState, utcnow  # noqa: E402
from orchestrator.planner import plan_job  # noqa: E402
from orchestrator.repositories import jobs as jobs_repo  # noqa: E402
from orchestrator.repositories import projects as projects_repo  # noqa: E402
from orchestrator.settings import Settings  # noqa: E402
from orchestrator.states.jobs import lock_job, set_job_state  # noqa: E402
from orchestrator_contract.jobs import JobSpec  # noqa: E402

ADMIN = "bench-admin-token"


class _NoCluster:
    """A stand-in cluster: the page reads the database only (logs are fetched by the page later, lazily)."""

    def __getattr__(self, name):
        def refuse(*args, **kwargs):
            from orchestrator.backend import BackendUnavailable

            raise BackendUnavailable("no cluster in this benchmark")

        return refuse


def seed(app, points: int, steps_per_epoch: int) -> tuple[str, str]:
    """The job and a viewer key of its project."""
    sessions = app.state.service.sessions
    with sessions.begin() as session:
        project = projects_repo.create_project(session, "bench")
        _, viewer = projects_repo.create_api_key(session, project.id, "viewer", "bench")
        spec = JobSpec(workload="digits", name="bench-100k")
        job_id = jobs_repo.create_job(session, project.id, spec, plan_job(spec), None).id
    for state, new_attempt in ((JobState.STARTING, False), (JobState.RUNNING, False), (JobState.RESTARTING, True)):
        with sessions.begin() as session:
            set_job_state(session, lock_job(session, job_id), state, "bench", "", new_attempt=new_attempt)
    with sessions.begin() as session:
        set_job_state(session, lock_job(session, job_id), JobState.RUNNING, "bench")
    first = int(points * 0.55)
    resume = int(first * 0.95)
    start = utcnow() - timedelta(hours=6)
    rows = []
    for i in range(points):
        attempt, step = (1, i) if i < first else (2, resume + (i - first))
        epoch = step // steps_per_epoch
        values = {"train_loss": 2.0 * math.exp(-step / 20000) + 0.05 * math.sin(step / 50)}
        if step % steps_per_epoch == steps_per_epoch - 1:
            values.update(val_accuracy=1 - math.exp(-step / 30000), val_loss=values["train_loss"] * 1.1)
        if step % 10 == 0:
            values["samples_per_s"] = 1200.0 + 50 * math.sin(step / 300)
        rows.append(
            {
                "job_id": job_id,
                "attempt": attempt,
                "epoch": epoch,
                "step": step,
                "values": values,
                "created_at": start + timedelta(seconds=0.2 * i),
            }
        )
    with sessions.begin() as session:
        for chunk in range(0, len(rows), 10_000):
            session.execute(insert(JobMetric), rows[chunk : chunk + 10_000])
        for n in range(10):
            session.add(
                Checkpoint(
                    job_id=job_id,
                    attempt=1,
                    epoch=n,
                    step=n * steps_per_epoch,
                    path=f"/nowhere/{n}",
                    size_bytes=1000,
                    metrics={"val_accuracy": 0.5 + n / 30},
                )
            )
    return job_id, viewer


def serve(app) -> tuple[uvicorn.Server, threading.Thread, str]:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return server, thread, url
        except httpx.TransportError:
            time.sleep(0.05)
    raise RuntimeError("the service did not start")


def sign_in(client: httpx.Client, key: str) -> None:
    import re

    form = client.get("/ui/login")
    token = re.search(r'name="csrf_token" value="([^"]*)"', form.text).group(1)
    answer = client.post("/ui/login", data={"api_key": key, "csrf_token": token})
    assert answer.status_code == 303, answer.text


def load_page(client: httpx.Client, job_id: str, cold: bool = True) -> tuple[float, int, str]:
    if cold:
        CHARTS.clear()
    began = time.perf_counter()
    page = client.get(f"/ui/jobs/{job_id}")
    summary = client.get(f"/ui/api/jobs/{job_id}")
    metrics = client.get(f"/ui/api/jobs/{job_id}/metrics?x=step&points=2000")
    took = time.perf_counter() - began
    assert page.status_code == summary.status_code == metrics.status_code == 200
    shown = metrics.json()["shown"]
    return took, shown, metrics.headers["etag"]


def load_reference(client: httpx.Client, job_id: str, key: str) -> tuple[float, int]:
    began = time.perf_counter()
    count, cursor = 0, None
    while True:
        params = {"limit": 1000, **({"cursor": cursor} if cursor else {})}
        answer = client.get(f"/v1/jobs/{job_id}/metrics", params=params, headers={"Authorization": f"Bearer {key}"})
        assert answer.status_code == 200, answer.text
        count += len(answer.json())
        cursor = answer.headers.get("X-Next-Cursor")
        if not cursor:
            break
    return time.perf_counter() - began, count


def browser_times(url: str, key: str, job_id: str, rounds: int) -> list[float]:
    import os
    import shutil

    from playwright.sync_api import sync_playwright

    path = os.environ.get("ORCHESTRATOR_CHROMIUM") or next(
        filter(None, (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome"))), None
    )
    if path is None:
        raise SystemExit("--browser: no Chromium found (scripts/ensure-chromium.sh installs Debian's)")
    times = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=path, args=["--no-sandbox"])
        # wait_for_function evaluates its predicate as a string: the pages' CSP (no eval) would refuse it
        options = {"viewport": {"width": 1400, "height": 1200}, "bypass_csp": True}
        signing = browser.new_context(**options)
        page = signing.new_page()
        page.goto(f"{url}/ui/login")
        page.fill("input[name=api_key]", key)
        page.click("button[type=submit]")
        page.wait_for_url("**/ui/jobs")
        session = signing.storage_state()
        for _ in range(rounds + 1):  # the first one warms up
            # A new context each time: an empty HTTP cache (else the browser revalidates the curves it has: 304)
            context = browser.new_context(storage_state=session, **options)
            page = context.new_page()
            CHARTS.clear()
            began = time.perf_counter()
            page.goto(f"{url}/ui/jobs/{job_id}")
            page.wait_for_function(
                "document.querySelectorAll('#charts .chart canvas').length >= 3 && "
                "document.getElementById('points-info').textContent.length > 0",
                timeout=120_000,
            )
            times.append(time.perf_counter() - began)
            context.close()
        browser.close()
    return times[1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--points", type=int, default=100_000)
    parser.add_argument("--steps-per-epoch", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--database-url", default=None, help="default: SQLite in a temporary folder")
    parser.add_argument("--browser", action="store_true", help="also time a headless Chromium drawing the page")
    args = parser.parse_args()

    folder = Path(tempfile.mkdtemp(prefix="ui-bench-"))
    settings = Settings(
        database_url=args.database_url or f"sqlite:///{folder / 'orchestrator.db'}",
        storage=str(folder / "storage"),
        var_dir=str(folder / "var"),
        admin_token=ADMIN,
    )
    app = create_app(settings, backend=_NoCluster(), run_loops=False)
    server, thread, url = serve(app)  # its start runs the migrations
    try:
        began = time.perf_counter()
        job_id, key = seed(app, args.points, args.steps_per_epoch)
        print(f"seeded {args.points:,} metric points in {time.perf_counter() - began:.1f} s ({settings.database_url})")
        with httpx.Client(base_url=url, timeout=300) as client:
            sign_in(client, key)
            load_page(client, job_id)  # warm-up: imports, templates, the database's caches
            load_reference(client, job_id, key)
            page_times, cached_times, reference_times, poll_times = [], [], [], []
            shown = count = 0
            etag = ""
            for round_ in range(args.rounds):
                order = ("page", "reference") if round_ % 2 == 0 else ("reference", "page")
                for which in order:
                    if which == "page":
                        took, shown, etag = load_page(client, job_id)
                        page_times.append(took)
                        cached_times.append(load_page(client, job_id, cold=False)[0])
                    else:
                        took, count = load_reference(client, job_id, key)
                        reference_times.append(took)
                poll_began = time.perf_counter()
                poll = client.get(f"/ui/api/jobs/{job_id}/metrics?x=step&points=2000", headers={"If-None-Match": etag})
                poll_times.append(time.perf_counter() - poll_began)
                assert poll.status_code == 304
        drawn = browser_times(url, key, job_id, args.rounds) if args.browser else []
    finally:
        server.should_exit = True
        thread.join(timeout=30)
    page, cached, reference, polled = (
        statistics.median(t) for t in (page_times, cached_times, reference_times, poll_times)
    )
    print(f"points {count:,}; drawn by the page {shown:,} (downsampled, extremes kept)")
    print(f"page  (HTML + job JSON + metrics JSON): median {page * 1000:.0f} ms, min {min(page_times) * 1000:.0f} ms")
    print(
        f"page, cached curves (a second viewer): median {cached * 1000:.0f} ms, min {min(cached_times) * 1000:.0f} ms"
    )
    print(
        f"reference (REST /v1/jobs/{{id}}/metrics, {math.ceil(count / 1000)} pages): median {reference * 1000:.0f} ms, "
        f"min {min(reference_times) * 1000:.0f} ms"
    )
    print(f"live poll, unchanged (304): median {polled * 1000:.1f} ms")
    if drawn:
        print(
            f"browser, navigation to every curve drawn (Chromium): median {statistics.median(drawn) * 1000:.0f} ms, "
            f"min {min(drawn) * 1000:.0f} ms"
        )
    print(f"ratio page / reference: {page / reference:.2f}; cached page / reference: {cached / reference:.3f}")


if __name__ == "__main__":
    main()
