"""Serving throughput: a deployment on Ray Serve vs the same model in a plain uvicorn + FastAPI app.

    .venv/bin/python bench/serve.py [--requests 600] [--rounds 2] [--python-proxy]

The model is a 6.3M-parameter MLP (``example_workloads.wide_mlp``: 1,024 inputs, two hidden layers
of 2,048; about 1 ms per sample and 6 ms per batch of 32 on one thread), trained for one epoch through
the service on a local 2-CPU Ray cluster, so both arms load the same committed checkpoint with the
same predictor (``workers.serve.app``). Arms:

- ``plain``: one uvicorn process with a FastAPI route that parses, predicts and answers in-process, at
  the niceness Ray gives its workers (15), so that on a shared machine both arms yield alike;
- ``serve``: the service's deployment of the checkpoint, batching off (``batching: null``);
- ``serve+batch``: the same with ``batching: {"max_batch_size": 32, "wait_ms": 2}``.

The cluster's Serve ingress is HAProxy (Ray Serve's throughput-optimized mode), as the service runs it by
default; ``--python-proxy`` measures Serve's Python proxy actor instead.

Each request is one row of 1,024 floats in a JSON body. For concurrency 1, 8 and 32 an asyncio client
(aiohttp, in a process of its own) keeps that many requests in flight until ``--requests`` have answered, after a warm-up; arms
alternate within each round. It prints req/s and p50/p99 latency per arm and concurrency (medians
over rounds), then the ratios: serve+batch / plain (target >= 0.6 at concurrency 32), serve+batch /
serve, and whether serve+batch's throughput rises with concurrency.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from fastapi import FastAPI, Request  # module level: FastAPI resolves the route's annotations here
from fastapi.responses import JSONResponse

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ADMIN = "bench-admin-token"
WORKLOAD = "example_workloads.wide_mlp:build"
CONFIG = {"features": 1024, "hidden": 2048, "samples": 512}
CONCURRENCY = (1, 8, 32)
ARMS = ("plain", "serve", "serve+batch")


# --- the plain app (run as a subprocess: `bench/serve.py --plain-app ...`) ------------------------------


def plain_app(port: int, checkpoint: str) -> None:
    import torch
    import uvicorn

    from workers.serve.app import load_serving_model, make_predictor
    from workers.serve.predictors import BadInput

    torch.set_num_threads(1)
    predictor = make_predictor(WORKLOAD, load_serving_model(checkpoint, WORKLOAD, CONFIG), CONFIG)
    app = FastAPI()

    @app.get("/healthz")
    async def healthz() -> dict:
        return {"status": "ok"}

    @app.post("/predict")
    async def predict(request: Request):
        try:
            item = predictor.parse(json.loads(await request.body()))
        except (ValueError, BadInput) as exc:
            return JSONResponse({"detail": str(exc)}, status_code=422)
        return JSONResponse({**predictor.predict([item])[0], "version": 0})

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


# --- load ---------------------------------------------------------------------------------------------------


async def load(url: str, body: bytes, concurrency: int, requests: int, warmup: int) -> tuple[float, float, float]:
    """(req/s, p50 ms, p99 ms) over ``requests`` answers with ``concurrency`` in flight."""
    import aiohttp

    headers = {"Content-Type": "application/json"}
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as http:

        async def run(total: int, latencies: list[float]) -> None:
            remaining = total

            async def worker() -> None:
                nonlocal remaining
                while remaining > 0:
                    remaining -= 1
                    started = time.perf_counter()
                    async with http.post(url, data=body, headers=headers) as response:
                        await response.read()
                        if response.status != 200:
                            raise RuntimeError(f"{url}: HTTP {response.status}: {await response.text()}")
                    latencies.append(time.perf_counter() - started)

            await asyncio.gather(*(worker() for _ in range(concurrency)))

        await run(warmup, [])
        latencies: list[float] = []
        started = time.perf_counter()
        await run(requests, latencies)
        elapsed = time.perf_counter() - started
    latencies.sort()
    return len(latencies) / elapsed, 1000 * latencies[len(latencies) // 2], 1000 * latencies[int(len(latencies) * 0.99)]


def measure(url: str, body: bytes, concurrency: int, requests: int, warmup: int) -> tuple[float, float, float]:
    """``load`` in a process of its own, so the load generator shares no interpreter (GIL) with the
    embedded service that runs in this one."""
    out = subprocess.run(
        [sys.executable, __file__, "--load", url, str(concurrency), str(requests), str(warmup)],
        input=body,
        capture_output=True,
        check=True,
        timeout=900,
    ).stdout
    return tuple(json.loads(out.decode().strip().splitlines()[-1]))  # type: ignore[return-value]


# --- setup --------------------------------------------------------------------------------------------------


def wait_healthy(api: httpx.Client, name: str, timeout_s: float = 300) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        deployment = api.get(f"/v1/deployments/{name}").json()
        if deployment["state"] == "HEALTHY":
            return deployment
        if deployment["state"] in ("FAILED", "UNHEALTHY"):
            raise RuntimeError(f"deployment {name}: {deployment['state']}: {deployment['message']}")
        time.sleep(1)
    raise RuntimeError(f"deployment {name} not healthy after {timeout_s} s")


def train(api: httpx.Client) -> dict:
    spec = {
        "workload": WORKLOAD,
        "config": CONFIG,
        "epochs": 1,
        "scaling": {"num_workers": 1},
        "optimizer": {"name": "adam"},
        "lr": {"base": 1e-3},
        "checkpoint": {"keep": 1},
    }
    job = api.post("/v1/jobs", json=spec)
    job.raise_for_status()
    job_id = job.json()["id"]
    deadline = time.monotonic() + 600
    while (state := api.get(f"/v1/jobs/{job_id}").json()["state"]) not in ("SUCCEEDED", "FAILED", "CANCELLED"):
        if time.monotonic() > deadline:
            raise RuntimeError(f"job {job_id} still {state}")
        time.sleep(1)
    if state != "SUCCEEDED":
        raise RuntimeError(f"job {job_id} ended {state}: {api.get(f'/v1/jobs/{job_id}').json()['message']}")
    return api.get(f"/v1/jobs/{job_id}/checkpoints").json()[-1]


def ray_worker_niceness() -> int:
    """The niceness Ray runs its workers at (Serve's replicas and proxy included; 15 here)."""
    pids = subprocess.run(["pgrep", "-f", "ray::ServeReplica"], capture_output=True, text=True).stdout.split()
    return os.getpriority(os.PRIO_PROCESS, int(pids[0])) if pids else 0


def start_plain(port: int, checkpoint: str, niceness: int) -> subprocess.Popen:
    """The plain app at the niceness of Ray's workers: on a shared machine both arms then yield the
    same way to everything else that runs."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(
        [sys.executable, __file__, "--plain-app", str(port), checkpoint],
        cwd=ROOT,
        env=env,
        preexec_fn=lambda: os.nice(niceness),
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                return process
        except httpx.HTTPError:
            time.sleep(0.5)
    process.kill()
    raise RuntimeError("the plain app did not start")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=600, help="measured requests per arm and concurrency")
    parser.add_argument("--warmup", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--python-proxy",
        action="store_true",
        help="Serve's Python proxy actor as the ingress instead of HAProxy (ORCHESTRATOR_SERVE_HAPROXY=false)",
    )
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    from api.embedded import serve_in_thread
    from orchestrator.backend.local_cluster import LocalRayCluster
    from orchestrator.backend.ray_backend import RayBackend
    from orchestrator.settings import Settings
    from tests.conftest import free_port

    root = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    cluster = LocalRayCluster(
        root / "var",
        gcs_port=free_port(),
        dashboard_port=free_port(),
        client_port=free_port(),
        num_cpus=2,
        num_gpus=0,
        serve_haproxy=not args.python_proxy,
    )
    cluster.start()
    plain = None
    settings = Settings(
        database_url=f"sqlite:///{root / 'orchestrator.db'}",
        storage=str(root / "storage"),
        var_dir=str(root / "var"),
        host="127.0.0.1",
        port=free_port(),
        admin_token=ADMIN,
        serve_port=free_port(),
        workload_packages="example_workloads",
        train_poll_interval_s=0.5,
    )
    try:
        with serve_in_thread(settings, RayBackend(cluster.dashboard_url, cluster.token())) as url:
            api = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=60)
            checkpoint = train(api)
            print(f"trained: checkpoint {checkpoint['id']} at {checkpoint['path']}", flush=True)
            urls = {}
            for name, batching in (("bench-unbatched", None), ("bench-batched", {"max_batch_size": 32, "wait_ms": 2})):
                response = api.post(
                    "/v1/deployments",
                    # auth none: the load generator sends no key (the key check is one SHA-256 per request).
                    json={
                        "name": name,
                        "source": {"checkpoint_id": checkpoint["id"]},
                        "batching": batching,
                        "auth": "none",
                    },
                )
                response.raise_for_status()
            for arm, name in (("serve", "bench-unbatched"), ("serve+batch", "bench-batched")):
                urls[arm] = wait_healthy(api, name)["url"]
            plain_port = free_port()
            niceness = ray_worker_niceness()
            print(f"Serve's replicas run at niceness {niceness}: the plain app too", flush=True)
            plain = start_plain(plain_port, checkpoint["path"], niceness)
            urls["plain"] = f"http://127.0.0.1:{plain_port}/predict"
            body = json.dumps({"inputs": [[random.Random(0).random() for _ in range(CONFIG["features"])]]}).encode()

            results: dict[tuple[str, int], list[tuple[float, float, float]]] = {}
            for round_ in range(args.rounds):
                for concurrency in CONCURRENCY:
                    order = list(ARMS) if round_ % 2 == 0 else list(reversed(ARMS))
                    for arm in order:
                        measured = measure(urls[arm], body, concurrency, args.requests, args.warmup)
                        results.setdefault((arm, concurrency), []).append(measured)
                        print(
                            f"round {round_ + 1} c={concurrency:<2} {arm:<12} {measured[0]:7.1f} req/s "
                            f"p50 {measured[1]:7.1f} ms  p99 {measured[2]:7.1f} ms",
                            flush=True,
                        )
            for name in ("bench-batched", "bench-unbatched"):
                api.delete(f"/v1/deployments/{name}")
    finally:
        if plain is not None:
            plain.terminate()
            plain.wait(30)
        cluster.stop()

    def median(arm: str, concurrency: int, index: int) -> float:
        return statistics.median(r[index] for r in results[(arm, concurrency)])

    print("\nmedians over rounds (req/s, p50 ms, p99 ms):")
    print(f"{'concurrency':<12}" + "".join(f"{arm:>28}" for arm in ARMS))
    for concurrency in CONCURRENCY:
        cells = [
            f"{median(arm, concurrency, 0):8.1f} {median(arm, concurrency, 1):8.1f} {median(arm, concurrency, 2):8.1f}"
            for arm in ARMS
        ]
        print(f"{concurrency:<12}" + "".join(f"{cell:>28}" for cell in cells))
    print("\nratios:")
    for concurrency in CONCURRENCY:
        batch, plain_, serve = (median(arm, concurrency, 0) for arm in ("serve+batch", "plain", "serve"))
        print(
            f"c={concurrency:<2}  serve+batch / plain = {batch / plain_:.2f}   serve+batch / serve = {batch / serve:.2f}"
            f"   serve / plain = {serve / plain_:.2f}"
        )
    batched = [median("serve+batch", c, 0) for c in CONCURRENCY]
    rises = all(b >= a for a, b in itertools.pairwise(batched))
    target = median("serve+batch", 32, 0) / median("plain", 32, 0)
    print(
        f"\nserve+batch throughput by concurrency {' -> '.join(f'{b:.0f}' for b in batched)}: "
        f"{'never falls' if rises else 'FALLS'}"
    )
    print(
        f"serve+batch / plain at concurrency 32: {target:.2f} (target >= 0.6: {'met' if target >= 0.6 else 'NOT met'})"
    )


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "--plain-app":
        plain_app(int(sys.argv[2]), sys.argv[3])
    elif len(sys.argv) >= 2 and sys.argv[1] == "--load":
        url, concurrency, requests, warmup = sys.argv[2], *map(int, sys.argv[3:6])
        print(json.dumps(asyncio.run(load(url, sys.stdin.buffer.read(), concurrency, requests, warmup))))
    else:
        main()
