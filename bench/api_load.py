"""The REST API under load with a year of history in PostgreSQL, against a bare FastAPI + SQLAlchemy app doing
the same queries on the same database (docs/benchmarks.md, "10,000 jobs"); and the scheduler's tick on that database.

    .venv/bin/python bench/api_load.py --seed          # seed a fresh orch_bench first (10,000 ended + 500 queued)
    .venv/bin/python bench/api_load.py                 # the database as bench/seed_db.py left it

    .venv/bin/python bench/api_load.py --workers 2     # each app as 2 uvicorn worker processes

Both apps run under uvicorn in their own process with the same settings (``--workers``, default 1; no access
log), on loopback; the service with its loops off and a stand-in cluster that is never asked (nothing is admitted:
a submitted job stays QUEUED). The client is a third process: httpx over asyncio, 32 requests in flight,
``--requests`` per app and scenario in rounds that alternate which app goes first, each round capped at
``--max-seconds``. The service is called with project team-00's member key, the bare app with that
project's id: the same rows. Jobs the run submits are deleted at the end.

Beside each rate, the servers' CPU time per request (their processes' user + system time over the rounds):
what a request costs the server, a figure that hardly moves with the machine's load, unlike a rate.

The scheduler's tick: ``Scheduler.tick`` on the seeded database, over a stand-in cluster whose CPUs the
running jobs hold, so each queued job is considered and waits; a load event on ``Job`` checks that no
ended job is loaded.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fastapi import Body, FastAPI, Header, Response  # noqa: E402
from sqlalchemy import and_, delete, event, func, or_, select  # noqa: E402
from sqlalchemy.orm import Session  # noqa: E402

from bench.seed_db import DEFAULT_URL, Sizes, fresh_database, key_for, seed  # noqa: E402
from orchestrator.admission import ClusterCapacity  # noqa: E402
from orchestrator.backend import BackendUnavailable  # noqa: E402
from orchestrator.db.engine import make_engine, make_session_factory  # noqa: E402
from orchestrator.db.models import Job, JobEvent, JobLabel, JobMetric, Project  # noqa: E402

URL_ENV = "ORCH_BENCH_URL"
PROJECT_ENV = "ORCH_BENCH_PROJECT"
BENCH_KEY_PREFIX = "bench-"  # idempotency keys of the jobs this run submits (deleted at the end)
SEED_SIZES = Sizes(jobs=10_520, queued=500, running=20)  # 10,000 ended, 500 queued, 20 running


# --- a cluster that is never asked to run anything ---------------------------------------------------------


class IdleCluster:
    """The cluster backend of both the served app and the tick: its capacity is what ``cpus`` says; running
    anything is refused (nothing is admitted here, and Ray is never started)."""

    def __init__(self, cpus: float = 4.0):
        self.cpus = cpus

    def capacity(self, fresh: bool = False) -> ClusterCapacity:
        total = {"CPU": self.cpus, "GPU": 0.0}
        return ClusterCapacity(total=dict(total), largest_node=dict(total))

    def live_jobs(self) -> list:
        return []  # nothing runs on it but what the control plane submits

    def __getattr__(self, name):
        def refuse(*args, **kwargs):
            raise BackendUnavailable(f"the benchmark's cluster does not {name}")

        return refuse


# --- the two apps (uvicorn --factory) ----------------------------------------------------------------------


def service_app():
    from api.app import create_app
    from orchestrator.settings import Settings

    var = Path(tempfile.mkdtemp(prefix="orch-bench-"))
    settings = Settings(
        database_url=os.environ[URL_ENV],
        storage=str(var / "storage"),
        var_dir=str(var / "var"),
        admin_token="bench-admin-token",
    )
    return create_app(settings, backend=IdleCluster(), run_loops=False)


def bare_app():
    """FastAPI + SQLAlchemy, the same queries as the service's routes, no auth, no checks."""
    from orchestrator.planner import plan_job
    from orchestrator_contract.jobs import JobSpec

    engine = make_engine(os.environ[URL_ENV])
    sessions = make_session_factory(engine)
    project_id = os.environ[PROJECT_ENV]
    app = FastAPI()

    def dumps(value) -> Response:
        return Response(json.dumps(value, default=_plain), media_type="application/json")

    def job_out(job: Job) -> dict:
        out = {c.key: getattr(job, c.key) for c in Job.__table__.columns if c.key != "token_hash"}
        out["labels"] = {label.key: label.value for label in job.labels}
        return out

    @app.get("/v1/jobs")
    def list_jobs(limit: int = 50, cursor: str | None = None):
        with sessions() as session:
            query = select(Job).where(Job.project_id == project_id)
            if cursor:
                created, job_id = json.loads(base64.urlsafe_b64decode(cursor))
                created = datetime.fromisoformat(created)
                query = query.where(
                    or_(Job.created_at < created, and_(Job.created_at == created, Job.id < job_id)),
                    Job.created_at <= created,
                )
            rows = list(session.scalars(query.order_by(Job.created_at.desc(), Job.id.desc()).limit(limit + 1)))
            return dumps({"items": [job_out(j) for j in rows[:limit]], "next_cursor": None})

    @app.get("/v1/jobs/{job_id}")
    def get_job(job_id: str):
        with sessions() as session:
            job = session.get(Job, job_id)
            return dumps(job_out(job))

    @app.get("/v1/jobs/{job_id}/metrics")
    def metrics(job_id: str, limit: int = 1000):
        with sessions() as session:
            session.get(Job, job_id)  # the route looks the job up first (404)
            query = select(JobMetric).where(JobMetric.job_id == job_id)
            rows = session.scalars(query.order_by(JobMetric.attempt, JobMetric.step).limit(limit + 1))
            return dumps(
                [{c: getattr(m, c) for c in ("attempt", "epoch", "step", "values", "created_at")} for m in rows]
            )

    @app.post("/v1/jobs", status_code=201)
    def submit(body: dict = Body(), idempotency_key: str = Header()):  # noqa: B008 (FastAPI's idiom)
        # A plain def, as the service's route: FastAPI runs it in its thread pool, off the event loop.
        spec = JobSpec.model_validate(body)
        plan = plan_job(spec)
        with sessions.begin() as session:
            found = session.scalars(
                select(Job).where(Job.project_id == project_id, Job.idempotency_key == idempotency_key)
            ).one_or_none()
            if found is not None:
                return dumps(job_out(found))
            job = Job(
                project_id=project_id,
                name=spec.name,
                workload=spec.runs,
                spec=spec.model_dump(mode="json"),
                plan=plan.model_dump(mode="json"),
                priority=spec.priority,
                idempotency_key=idempotency_key,
                token_hash="",
                labels=[JobLabel(key=k, value=v) for k, v in spec.labels.items()],
            )
            session.add(job)
            session.flush()
            session.add(JobEvent(job_id=job.id, from_state=None, to_state=job.state, reason="submitted"))
            session.flush()
            out = job_out(job)
        return Response(json.dumps(out, default=_plain), status_code=201, media_type="application/json")

    return app


def _plain(value):
    return value.isoformat() if isinstance(value, datetime) else str(value)


# --- the client --------------------------------------------------------------------------------------------


async def _drive(base: str, requests: list[tuple[str, str, dict, dict | None]], concurrency: int, max_s: float):
    """Send ``requests`` (method, path, headers, json) with ``concurrency`` in flight; latencies (s) of the
    ones sent before ``max_s``, the wall time, and the non-2xx answers."""
    import httpx

    latencies: list[float] = []
    errors: list[str] = []
    queue = iter(requests)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=30) as client:
        started = time.perf_counter()

        async def worker():
            for method, path, headers, body in queue:
                if time.perf_counter() - started > max_s:
                    return
                t0 = time.perf_counter()
                try:
                    response = await client.request(method, path, headers=headers, json=body)
                except httpx.TransportError as error:  # counted, not fatal: the run goes on and reports it
                    errors.append(f"{type(error).__name__} {error}")
                    continue
                latencies.append(time.perf_counter() - t0)
                if response.status_code >= 300:
                    errors.append(f"{response.status_code} {response.text[:200]}")

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - started
    return latencies, wall, errors


class Client:
    """A process of its own that runs batches of requests."""

    def __init__(self):
        context = multiprocessing.get_context("spawn")
        self.jobs, self.results = context.Queue(), context.Queue()
        self.process = context.Process(target=_client_loop, args=(self.jobs, self.results), daemon=True)
        self.process.start()

    def run(self, base, requests, concurrency, max_s):
        self.jobs.put((base, requests, concurrency, max_s))
        return self.results.get()

    def close(self):
        self.jobs.put(None)
        self.process.join(10)


def _client_loop(jobs, results) -> None:
    while (job := jobs.get()) is not None:
        results.put(asyncio.run(_drive(*job)))


# --- servers -----------------------------------------------------------------------------------------------


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(factory: str, env: dict, workers: int) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    command = [sys.executable, "-m", "uvicorn", "--factory", f"bench.api_load:{factory}"]
    command += [
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        str(workers),
        "--log-level",
        "warning",
        "--no-access-log",
        # Longer than any pause of a loaded client: the default 5 s could close a kept-alive connection as the
        # client reuses it (a ReadError, seen under load average 9).
        "--timeout-keep-alive",
        "60",
    ]
    process = subprocess.Popen(command, cwd=ROOT, env={**os.environ, **env, "PYTHONPATH": str(ROOT)})
    base = f"http://127.0.0.1:{port}"
    import httpx

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            httpx.get(base + "/v1/jobs?limit=1", headers={"Authorization": f"Bearer {key_for(0)}"}, timeout=2)
            return process, base
        except httpx.HTTPError:
            if process.poll() is not None:
                raise SystemExit(f"{factory} exited: {process.returncode}") from None
            time.sleep(0.3)
    process.kill()
    raise SystemExit(f"{factory} did not start in 60 s")


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a server so far: its process and its children (uvicorn's workers). Unlike
    a rate, what a request costs in CPU hardly moves with the machine's load (other helpers' tests)."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # a process that ended meanwhile
            continue
        if int(stat.parent.name) == pid or int(fields[1]) == pid:
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


# --- the scheduler's tick ----------------------------------------------------------------------------------


def measure_tick(url: str, ticks: int) -> dict:
    from orchestrator.admission import reserved_by
    from orchestrator.loops.scheduler import Scheduler
    from orchestrator.services.runs import active_demands
    from orchestrator.settings import Settings
    from orchestrator.states.jobs import TERMINAL

    engine = make_engine(url)
    sessions = make_session_factory(engine)
    with sessions() as session:
        held = reserved_by(active_demands(session))["CPU"]
        counts = dict(session.execute(select(Job.state, func.count()).group_by(Job.state)).all())
    cluster = IdleCluster(cpus=max(held, 1.0))  # the running jobs hold every CPU: each queued job waits
    scheduler = Scheduler(sessions, cluster, Settings(database_url=url))
    loaded: list[str] = []

    def on_load(job, _context):
        loaded.append(job.state)

    event.listen(Job, "load", on_load)
    try:
        scheduler.tick()  # the first one notes each queued job's reason
        times = []
        for _ in range(ticks):
            t0 = time.perf_counter()
            scheduler.tick()
            times.append((time.perf_counter() - t0) * 1000)
    finally:
        event.remove(Job, "load", on_load)
        engine.dispose()
    ended_loaded = sum(1 for state in loaded if state in TERMINAL)
    return {
        "counts": {str(k): v for k, v in counts.items()},
        "ms": times,
        "ended_loaded": ended_loaded,
        "loaded": len(loaded),
    }


# --- scenarios ---------------------------------------------------------------------------------------------


def _scenarios(session: Session, project_id: str, run_tag: str) -> dict[str, callable]:
    """name -> (arm, i) -> (method, path, headers, body) for the i-th request of that arm."""
    ids = list(
        session.scalars(
            select(Job.id)
            .where(Job.project_id == project_id, Job.state == "SUCCEEDED")
            .order_by(Job.created_at)
            .limit(64)
        )
    )
    newest_first = select(Job.created_at, Job.id).where(Job.project_id == project_id)
    total = session.scalar(select(func.count()).select_from(newest_first.subquery()))
    created, deep_id = session.execute(
        newest_first.order_by(Job.created_at.desc(), Job.id.desc()).offset(total * 4 // 5).limit(1)
    ).one()
    deep = base64.urlsafe_b64encode(json.dumps([created.isoformat(), deep_id]).encode()).decode()
    auth = {"Authorization": f"Bearer {key_for(0)}"}
    body = {"workload": "digits", "name": "bench-submit", "labels": {"team": "bench"}}

    def headers(arm):
        return auth if arm == "service" else {}

    return {
        "GET /v1/jobs?limit=50": lambda arm, i: ("GET", "/v1/jobs?limit=50", headers(arm), None),
        "GET /v1/jobs?limit=50&cursor=<80 % deep>": lambda arm, i: (
            "GET",
            f"/v1/jobs?limit=50&cursor={deep}",
            headers(arm),
            None,
        ),
        "GET /v1/jobs/{id}": lambda arm, i: ("GET", f"/v1/jobs/{ids[i % len(ids)]}", headers(arm), None),
        "GET /v1/jobs/{id}/metrics": lambda arm, i: (
            "GET",
            f"/v1/jobs/{ids[i % len(ids)]}/metrics",
            headers(arm),
            None,
        ),
        "POST /v1/jobs (Idempotency-Key)": lambda arm, i: (
            "POST",
            "/v1/jobs",
            {**headers(arm), "Idempotency-Key": f"{BENCH_KEY_PREFIX}{run_tag}-{arm}-{i}"},
            body,
        ),
    }


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def seed_fresh(url: str) -> None:
    """Drop, create and seed the database ``url`` names with ``SEED_SIZES``, then ANALYZE it (the planner's view)."""
    fresh_database(url)
    engine = make_engine(url)
    t0 = time.monotonic()
    seed(engine, SEED_SIZES)
    with engine.begin() as conn:
        conn.exec_driver_sql("ANALYZE")
    engine.dispose()
    print(f"seeded {url} in {time.monotonic() - t0:.0f} s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url", nargs="?", default=DEFAULT_URL)
    parser.add_argument("--seed", action="store_true", help="drop, create and seed the database first")
    parser.add_argument("--requests", type=int, default=1500, help="requests per app and scenario")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per scenario, alternating which app goes first")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--max-seconds", type=float, default=30.0, help="cap of one app's round")
    parser.add_argument("--ticks", type=int, default=20)
    parser.add_argument("--only", default="", help="run only the scenarios whose name contains this")
    parser.add_argument(
        "--workers", type=int, default=1, help="uvicorn worker processes of EACH app (the same for both, to be fair)"
    )
    args = parser.parse_args()

    if args.seed:
        seed_fresh(args.url)

    tick = measure_tick(args.url, args.ticks)
    print(f"jobs by state: {tick['counts']}")
    ms = tick["ms"]
    print(
        f"scheduler tick ({len(ms)} ticks): median {statistics.median(ms):.1f} ms, max {max(ms):.1f} ms; "
        f"jobs loaded per tick {tick['loaded'] // (len(ms) + 1)}, ended jobs loaded {tick['ended_loaded']}"
    )

    engine = make_engine(args.url)
    sessions = make_session_factory(engine)
    run_tag = f"{int(time.time())}"
    with sessions() as session:
        project_id = session.scalar(select(Project.id).where(Project.name == "team-00"))
        scenarios = _scenarios(session, project_id, run_tag)
    env = {URL_ENV: args.url, PROJECT_ENV: project_id}
    servers = {}
    client = None
    per_round = max(1, args.requests // args.rounds)
    rows = []
    try:
        for arm, factory in (("bare", "bare_app"), ("service", "service_app")):
            servers[arm] = _serve(factory, env, args.workers)
        print(f"both apps under uvicorn --workers {args.workers}", flush=True)
        client = Client()
        for name, make in scenarios.items():
            if args.only and args.only not in name:
                continue
            stats = {arm: {"lat": [], "wall": 0.0, "errors": [], "cpu": 0.0} for arm in servers}
            sent = dict.fromkeys(servers, 0)
            for arm, (_, base) in servers.items():  # warm-up: connections, caches, the first plans
                client.run(base, [make(arm, 10_000_000 + i) for i in range(64)], args.concurrency, args.max_seconds)
            for round_ in range(args.rounds):
                order = list(servers) if round_ % 2 == 0 else list(reversed(servers))
                for arm in order:
                    requests = [make(arm, sent[arm] + i) for i in range(per_round)]
                    cpu = _cpu_seconds(servers[arm][0].pid)
                    latencies, wall, errors = client.run(servers[arm][1], requests, args.concurrency, args.max_seconds)
                    stats[arm]["cpu"] += _cpu_seconds(servers[arm][0].pid) - cpu
                    sent[arm] += per_round
                    stats[arm]["lat"] += latencies
                    stats[arm]["wall"] += wall
                    stats[arm]["errors"] += errors
            rate = {arm: len(s["lat"]) / s["wall"] for arm, s in stats.items()}
            row = {
                "scenario": name,
                "bare_rps": rate["bare"],
                "service_rps": rate["service"],
                "ratio": rate["service"] / rate["bare"],
                **{f"{arm}_p50": _pct(s["lat"], 0.50) for arm, s in stats.items()},
                **{f"{arm}_p99": _pct(s["lat"], 0.99) for arm, s in stats.items()},
                **{f"{arm}_cpu_ms": s["cpu"] * 1000 / max(1, len(s["lat"])) for arm, s in stats.items()},
                "errors": {
                    arm: s["errors"][:3] + ([f"... {len(s['errors'])} in all"] if s["errors"] else [])
                    for arm, s in stats.items()
                },
                "n": {arm: len(s["lat"]) for arm, s in stats.items()},
            }
            rows.append(row)
            print(
                f"{name:<42} service {row['service_rps']:7.1f} req/s (p50 {row['service_p50']:6.1f} ms, p99 "
                f"{row['service_p99']:6.1f} ms) | bare {row['bare_rps']:7.1f} req/s (p50 {row['bare_p50']:6.1f} ms, "
                f"p99 {row['bare_p99']:6.1f} ms) | ratio {row['ratio']:.2f} | server CPU ms/request service "
                f"{row['service_cpu_ms']:.2f}, bare {row['bare_cpu_ms']:.2f} | n {row['n']}",
                flush=True,
            )
            for arm, errors in row["errors"].items():
                if errors:
                    print(f"  {arm} errors: {errors}")
    finally:
        if client is not None:
            client.close()
        for process, _ in servers.values():
            process.terminate()
            process.wait(10)
        with sessions.begin() as session:
            gone = session.execute(delete(Job).where(Job.idempotency_key.like(f"{BENCH_KEY_PREFIX}%"))).rowcount
        engine.dispose()
        print(f"deleted the {gone} jobs this run submitted")
    print(json.dumps({"tick_ms": ms, "rows": rows}, default=str))


if __name__ == "__main__":
    main()
