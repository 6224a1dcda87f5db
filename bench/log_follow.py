"""50 clients following one running job whose log holds 50 MB: the server's CPU per second while they follow
against the same server idle, for today's follow (each byte read once, each line judged once: docs/security.md,
finding 11) and the one before it (the whole log re-read from Ray and from the archive every poll and run
through the log view for each follower, the code of 3b3888e), side by side in one run.

    .venv/bin/python bench/log_follow.py                      # 50 MB, 50 followers, 30 s windows
    .venv/bin/python bench/log_follow.py --mb 5 --seconds 10  # a quicker look

Each arm is the service under uvicorn in a process of its own (SQLite, its loops on: the scheduler admits the
job, the log archiver copies its output every 5 s, as in production) over a stand-in cluster, not a Ray
cluster: what is measured is the control plane's own work, and a stand-in keeps Ray's (its dashboard serving
50 MB a second to the old follow) out of the number and the 2-core machine's noise down. The stand-in's job
has printed ``--mb`` of Ray Train lines and prints 10 more a second; its log tail is sent as Ray's agent sends
one (the file in batches of 10 lines, each a message of its own, then what is new once a second), and a plain
read of its log returns the whole text, as Ray's ``GET /api/jobs/{id}/logs`` does. Only the server process's
CPU is counted (user + system, from /proc).

Per arm: a warm-up, then ``--seconds`` idle (the job runs, nobody follows), then ``--followers`` clients
(another process, httpx over asyncio, one key) follow with ``?tail=100`` and, once every one has its first
lines, ``--seconds`` more. Beside the CPU: how long until every follower had its first lines, the lines each
follower received a second (the job prints 10), and the latency of ``GET /v1/jobs/{id}`` asked every 0.5 s
during each window (the old follow filtered on the event loop).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.admission import ClusterCapacity  # noqa: E402
from orchestrator.backend import (  # noqa: E402
    ClusterNode,
    LogChunk,
    RunInfo,
    RunNotFound,
    RunStatus,
    ServeStatus,
)

ADMIN = "bench-admin-token"
ARM_ENV, MB_ENV = "ORCH_BENCH_FOLLOW_ARM", "ORCH_BENCH_LOG_MB"
PRINTS_PER_S = 10


# --- the stand-in cluster ----------------------------------------------------------------------------------


class LogCluster:
    """Runs every submitted job at once; each run's driver has printed the same ``mb`` of Ray Train lines and
    prints 10 more a second (a thread of the server process)."""

    def __init__(self, mb: float):
        self.runs: set[str] = set()
        self.lines: list[str] = []
        size = 0
        while size < mb * 1_000_000:
            line = _ray_train_line(len(self.lines))
            self.lines.append(line)
            size += len(line)
        threading.Thread(target=self._print, daemon=True).start()

    def _print(self) -> None:
        while True:
            time.sleep(1 / PRINTS_PER_S)
            self.lines.append(_ray_train_line(len(self.lines)))  # one append: atomic for readers

    def capacity(self, fresh: bool = False) -> ClusterCapacity:
        return ClusterCapacity(total={"CPU": 64.0, "GPU": 0.0}, largest_node={"CPU": 64.0, "GPU": 0.0})

    def live_jobs(self) -> list:
        return []  # nothing runs on it but what the control plane submits

    def nodes(self) -> list[ClusterNode]:
        return [ClusterNode("bench-head", "127.0.0.1", True, {"CPU": 64.0})]

    def worker_nodes(self, submission_id) -> set[str]:
        return {"bench-head"}

    def submit(self, submission_id, entrypoint, runtime_env, metadata) -> None:
        self.runs.add(submission_id)

    def info(self, submission_id) -> RunInfo:
        return RunInfo(RunStatus.RUNNING if submission_id in self.runs else RunStatus.MISSING)

    def stop(self, submission_id) -> None:
        pass

    def logs(self, submission_id) -> str | None:
        """What Ray's ``GET /api/jobs/{id}/logs`` gives: the whole output so far."""
        return "".join(self.lines[: len(self.lines)]) if submission_id in self.runs else None

    async def tail_logs(self, submission_id):
        """As Ray's log tail sends it: batches of 10 lines, each a message, until the end of the file; then,
        once a second, what was printed since."""
        if submission_id not in self.runs:
            raise RunNotFound(submission_id)
        sent = 0
        while True:
            end = len(self.lines)
            while sent < end:
                batch = self.lines[sent : min(sent + 10, end)]
                sent += len(batch)
                yield LogChunk("".join(batch), at_end=sent == end)
                await asyncio.sleep(0)  # a message of its own: the loop serves others between two
            await asyncio.sleep(1.0)

    def upload_package(self, uri, open_package, size) -> bool:
        return False

    def serve_status(self) -> ServeStatus:
        return ServeStatus(running=False)

    def apply_serve(self, config: dict) -> None:
        pass


def _ray_train_line(i: int) -> str:
    return (
        f"\x1b[36m(RayTrainWorker pid=4242)\x1b[0m epoch {i // 1000 + 1}/500 step {i}: train_loss 0.{i % 99991:05d}, "
        f"val_loss 0.{i % 99989:05d}, val_accuracy 0.{i % 99971:05d}, 11532 samples/s\n"
    )


# --- the follow before docs/security.md's finding 11 (3b3888e), kept here as the reference -------------------------


def _old_view(text: str, keep_ray_chatter: bool = False, rank: int | None = None) -> str:
    """log_lines.view as it was: the whole text judged line by line, every time."""
    from orchestrator.services.log_lines import CHATTER, DEDUP_HINT, RAY_PREFIX, _learn_ranks, strip_ansi

    def lines():
        ranks: dict = {}
        for line in strip_ansi(text).splitlines(keepends=True):
            prefix = RAY_PREFIX.match(line)
            body = line[prefix.end() :] if prefix else line
            process = (prefix["pid"], prefix["ip"]) if prefix else None
            _learn_ranks(body, process, ranks)
            if rank is not None and (process is None or ranks.get(process) != rank):
                continue
            if not keep_ray_chatter:
                if CHATTER.match(body):
                    continue
                line = DEDUP_HINT.sub("", line)
            yield line

    return "".join(lines())


def reread_every_poll(service):
    """``LogFollows`` whose streams are the old ones: every poll, the job's whole output read again (Ray's copy
    and the archive's, ``read_logs``) once for all followers, then ``view`` over all of it per follower."""
    import anyio

    from orchestrator.db.models import Job
    from orchestrator.services.logs import LogFollows, last_lines, read_logs
    from orchestrator.states.jobs import TERMINAL

    @dataclass(frozen=True)
    class Snapshot:
        text: str
        finished: bool

    class RereadEveryPoll(LogFollows):
        def __init__(self, *args):
            super().__init__(*args)
            self.latest, self.reading = {}, {}

        async def _stream(self, job_id, key, tail, rank):
            try:
                sent = None
                while True:
                    snapshot = await self._snapshot(job_id)
                    if snapshot is None:
                        return
                    raw = snapshot.text if snapshot.finished else snapshot.text[: snapshot.text.rfind("\n") + 1]
                    text = _old_view(raw, self.keep_ray_chatter, rank)
                    if sent is None:
                        sent = len(text) - len(last_lines(text, tail))
                    if len(text) < sent:
                        sent = 0
                    if len(text) > sent:
                        yield text[sent:]
                        sent = len(text)
                    if snapshot.finished:
                        return
                    await asyncio.sleep(self.poll_s)
            finally:
                self._release(job_id, key)

        async def _snapshot(self, job_id):
            lock = self.reading.setdefault(job_id, asyncio.Lock())
            async with lock:
                read_at, snapshot = self.latest.get(job_id, (0.0, None))
                if snapshot is None or time.monotonic() - read_at >= self.poll_s:
                    snapshot = await anyio.to_thread.run_sync(self._read, job_id)
                    self.latest[job_id] = (time.monotonic(), snapshot)
                return snapshot

        def _read(self, job_id):
            with self.sessions() as session:
                job = session.get(Job, job_id)
                if job is None:
                    return None
                return Snapshot(read_logs(self.backend, self.archive, job), job.state in TERMINAL)

    old = service.log_follows
    return RereadEveryPoll(
        old.sessions, old.backend, old.archive, old.max_per_key, old.poll_s, old.max_s, old.keep_ray_chatter
    )


# --- the served app (uvicorn --factory) --------------------------------------------------------------------


def service_app():
    from api.app import create_app
    from orchestrator.settings import Settings

    var = Path(tempfile.mkdtemp(prefix="orch-bench-follow-"))
    settings = Settings(
        database_url=f"sqlite:///{var / 'orchestrator.db'}",
        storage=str(var / "storage"),
        var_dir=str(var / "var"),
        admin_token=ADMIN,
        max_log_follows_per_key=1000,
    )
    app = create_app(settings, backend=LogCluster(float(os.environ[MB_ENV])))
    if os.environ[ARM_ENV] == "reread":
        service = app.state.service
        start = service.start

        def start_with_the_old_follow() -> None:
            start()  # makes service.log_follows
            service.log_follows = reread_every_poll(service)

        service.start = start_with_the_old_follow
    return app


# --- the followers (a process of their own) ----------------------------------------------------------------


async def _follow(base: str, job: str, followers: int, tail: int, seconds: float, started_at) -> dict:
    """``followers`` streams of the job's log: the time until each had its first lines, then the lines each
    received over ``seconds`` once all had theirs."""
    import httpx

    first: list[float] = []
    counted = [0] * followers
    counting = asyncio.Event()
    t0 = time.perf_counter()
    limits = httpx.Limits(max_connections=followers + 4)
    async with httpx.AsyncClient(
        base_url=base, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=None, limits=limits
    ) as client:

        async def one(i: int) -> None:
            params = {"follow": "true", "tail": str(tail)}
            async with client.stream("GET", f"/v1/jobs/{job}/logs", params=params) as response:
                assert response.status_code == 200, response.status_code
                started = False
                async for text in response.aiter_text():
                    if not started:
                        started = True
                        first.append(time.perf_counter() - t0)
                    elif counting.is_set():
                        counted[i] += text.count("\n")

        tasks = [asyncio.create_task(one(i)) for i in range(followers)]
        while len(first) < followers:
            await asyncio.sleep(0.05)
            for task in tasks:
                if task.done() and task.exception():
                    raise task.exception()
        started_at.put(time.time())  # the main process starts its CPU window now
        counting.set()
        await asyncio.sleep(seconds)
        counting.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return {"first_s": first, "lines": counted}


def _followers_process(args, results, started_at) -> None:
    results.put(asyncio.run(_follow(*args, started_at)))


# --- the server and its CPU ----------------------------------------------------------------------------------


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(arm: str, mb: float) -> tuple[subprocess.Popen, str]:
    import httpx

    port = _free_port()
    command = [sys.executable, "-m", "uvicorn", "--factory", "bench.log_follow:service_app", "--host", "127.0.0.1"]
    command += ["--port", str(port), "--log-level", "warning", "--no-access-log"]
    env = {**os.environ, ARM_ENV: arm, MB_ENV: str(mb), "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(command, cwd=ROOT, env=env)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(base + "/healthz", timeout=2).status_code == 200:
                return process, base
        except httpx.HTTPError:
            pass
        if process.poll() is not None:
            raise SystemExit(f"the {arm} server exited: {process.returncode}")
        time.sleep(0.3)
    process.kill()
    raise SystemExit(f"the {arm} server did not start in 120 s")


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


class Probe:
    """``GET /v1/jobs/{id}`` every 0.5 s in a thread: its latencies (s) since the last ``take``."""

    def __init__(self, base: str, job: str):
        import httpx

        self.client = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=300)
        self.job, self.latencies, self.stopped = job, [], threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopped.wait(0.5):
            t0 = time.perf_counter()
            self.client.get(f"/v1/jobs/{self.job}").raise_for_status()
            self.latencies.append(time.perf_counter() - t0)

    def take(self) -> list[float]:
        taken, self.latencies = self.latencies, []
        return taken

    def close(self) -> None:
        self.stopped.set()
        self.thread.join(400)
        self.client.close()


def run_arm(arm: str, args) -> dict:
    import httpx

    process, base = _serve(arm, args.mb)
    probe = None
    try:
        http = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=60)
        job = http.post("/v1/jobs", json={"workload": "digits", "name": "followed"}).json()["id"]
        deadline = time.monotonic() + 60
        while http.get(f"/v1/jobs/{job}").json()["attempt"] < 1:  # the scheduler admits it
            if time.monotonic() > deadline:
                raise SystemExit("the job was never admitted")
            time.sleep(0.2)
        time.sleep(args.warmup)  # the archiver's first copies, the first ticks
        probe = Probe(base, job)
        cpu = _cpu_seconds(process.pid)
        time.sleep(args.seconds)
        idle_cpu = (_cpu_seconds(process.pid) - cpu) / args.seconds
        idle_latency = probe.take()

        context = multiprocessing.get_context("spawn")
        results, started_at = context.Queue(), context.Queue()
        followers = context.Process(
            target=_followers_process,
            args=((base, job, args.followers, args.tail, args.seconds), results, started_at),
            daemon=True,
        )
        t0 = time.monotonic()
        followers.start()
        started_at.get(timeout=args.max_start_s)
        startup_s = time.monotonic() - t0
        probe.take()
        cpu = _cpu_seconds(process.pid)
        t1 = time.monotonic()
        follow = results.get(timeout=args.seconds + 600)
        window = time.monotonic() - t1  # the followers' window, and the time to hand its result over
        follow_cpu = (_cpu_seconds(process.pid) - cpu) / window
        follow_latency = probe.take()
        followers.join(30)
    finally:
        if probe is not None:
            probe.close()
        process.terminate()
        process.wait(30)
    return {
        "arm": arm,
        "idle_cpu_per_s": idle_cpu,
        "follow_cpu_per_s": follow_cpu,
        "ratio": follow_cpu / max(idle_cpu, 1e-3),
        "startup_s": startup_s,
        "first_lines_s_max": max(follow["first_s"]),
        "lines_per_follower_per_s": statistics.median(follow["lines"]) / args.seconds,
        "idle_latency_ms": _ms(idle_latency),
        "follow_latency_ms": _ms(follow_latency),
    }


def _ms(latencies: list[float]) -> dict:
    if not latencies:
        return {"n": 0}
    ordered = sorted(latencies)
    return {"n": len(ordered), "p50": ordered[len(ordered) // 2] * 1000, "max": ordered[-1] * 1000}


def _said(latency: dict) -> str:
    return f"{latency['p50']:.0f}/{latency['max']:.0f} ms (n {latency['n']})" if latency["n"] else "none answered"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=50.0, help="the log's size when the followers come")
    parser.add_argument("--followers", type=int, default=50)
    parser.add_argument("--tail", type=int, default=100, help="each follower's ?tail=")
    parser.add_argument("--seconds", type=float, default=30.0, help="each window: idle, then following")
    parser.add_argument("--warmup", type=float, default=8.0)
    parser.add_argument("--max-start-s", type=float, default=900.0, help="how long the followers may take to start")
    parser.add_argument("--arms", default="new,reread", help="which follows, in this order")
    args = parser.parse_args()

    rows = []
    for arm in args.arms.split(","):
        row = run_arm(arm, args)
        rows.append(row)
        print(
            f"{arm:<7} server CPU/s idle {row['idle_cpu_per_s']:.3f}, following {row['follow_cpu_per_s']:.3f} "
            f"(x{row['ratio']:.1f}) | all {args.followers} following after {row['startup_s']:.1f} s | "
            f"lines/s per follower {row['lines_per_follower_per_s']:.1f} (printed {PRINTS_PER_S}) | "
            f"GET /v1/jobs/{{id}} p50/max idle {_said(row['idle_latency_ms'])}, following "
            f"{_said(row['follow_latency_ms'])}",
            flush=True,
        )
    by_arm = {row["arm"]: row for row in rows}
    if {"new", "reread"} <= by_arm.keys():
        extra = {arm: by_arm[arm]["follow_cpu_per_s"] - by_arm[arm]["idle_cpu_per_s"] for arm in by_arm}
        print(
            f"following's own CPU/s (following - idle): new {extra['new']:.3f}, reread {extra['reread']:.3f}; "
            f"reread / new: {extra['reread'] / max(extra['new'], 1e-3):.1f}"
        )
    print(json.dumps({"args": vars(args), "rows": rows}))


if __name__ == "__main__":
    main()
