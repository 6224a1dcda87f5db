"""Steady-state training throughput through the service vs the same loop under plain torchrun.

    .venv/bin/python bench/train_throughput.py [--rounds 3] [--epochs 4] [--gpus N]

One workload and spec for both arms (tiny_gpt on generated text, 2 CPU workers, gloo, OMP_NUM_THREADS=1
and one torch thread per rank; with ``--gpus N``, N workers with a GPU each, NCCL, on a cluster given N GPUs). The service arm submits the job over HTTP to the real service on a
local Ray cluster and reads the samples/s step metrics it streamed; the reference arm runs
`torchrun --nproc_per_node=2 -m workers.runtime.torchrun`. Arms alternate, round by round, so both see the
same machine; both report the loop's own steady-state samples/s (all epochs but the first, which holds
start-up and warm-up): the service arm from the job's result, the torchrun arm from its last line. The last line is the median
of the per-round ratios service / torchrun.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from api.embedded import serve_in_thread  # noqa: E402
from orchestrator.backend.local_cluster import LocalRayCluster  # noqa: E402
from orchestrator.backend.ray_backend import RayBackend  # noqa: E402
from orchestrator.settings import Settings  # noqa: E402
from tests.conftest import free_port  # noqa: E402

ADMIN = "bench-admin-token"


def job_spec(text_path: Path, epochs: int, metrics_every_steps: int, gpus: int = 0) -> dict:
    scaling = {"num_workers": gpus, "use_gpu": True} if gpus else {"num_workers": 2}
    return {
        "workload": "tiny_gpt",
        "config": {"text_path": str(text_path), "context": 64, "layers": 2, "width": 128, "heads": 4},
        "scaling": {**scaling, "cpus_per_worker": 1},
        "epochs": epochs,
        "batch": {"per_worker": 16},
        "optimizer": {"name": "adamw"},
        "lr": {"base": 1e-3, "base_batch": 32},
        "metrics_every_steps": metrics_every_steps,
        "checkpoint": {"every_epochs": epochs, "keep": 1},  # one checkpoint, at the end: not in the timing
    }


def service_arm(api: httpx.Client, spec: dict) -> float:
    job = api.post("/v1/jobs", json=spec).json()
    deadline = time.monotonic() + 900
    while (state := api.get(f"/v1/jobs/{job['id']}").json()["state"]) not in ("SUCCEEDED", "FAILED", "CANCELLED"):
        if time.monotonic() > deadline:
            raise RuntimeError(f"job {job['id']} still {state}")
        time.sleep(1)
    if state != "SUCCEEDED":
        message = api.get(f"/v1/jobs/{job['id']}").json()["message"]
        raise RuntimeError(f"job {job['id']} ended {state}: {message}")
    # The loop's own steady-state figure (epochs after the first), the same one the torchrun arm prints.
    return float(api.get(f"/v1/jobs/{job['id']}").json()["result"]["metrics"]["samples_per_s"])


def torchrun_arm(spec_path: Path, workers: int) -> float:
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={workers}",
        "--master_port",
        str(free_port()),
        "-m",
        "workers.runtime.torchrun",
        "--spec",
        str(spec_path),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=True).stdout
    return float(json.loads(out.strip().splitlines()[-1])["samples_per_s"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--metrics-every", type=int, default=10, help="the spec's metrics_every_steps")
    parser.add_argument("--gpus", type=int, default=0, help="N workers with a GPU each (default: 2 CPU workers)")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-throughput-"))
    text = work / "corpus.txt"
    text.write_text(
        "".join(f"line {i}: the quick brown fox jumps over the lazy dog {i * 7 % 13}.\n" for i in range(4000))
    )
    spec = job_spec(text, args.epochs, args.metrics_every, args.gpus)
    spec_path = work / "spec.json"
    spec_path.write_text(json.dumps(spec))

    cluster = LocalRayCluster(work / "var", free_port(), free_port(), free_port(), num_cpus=2, num_gpus=args.gpus)
    cluster.start()
    settings = Settings(
        database_url=f"sqlite:///{work / 'bench.db'}",
        storage=str(work / "storage"),
        var_dir=str(work / "var"),
        port=free_port(),
        admin_token=ADMIN,
        data_roots=str(work),  # the corpus
    )
    rows = []
    try:
        with serve_in_thread(settings, RayBackend(cluster.dashboard_url, cluster.token())) as url:
            api = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30)
            for round_number in range(1, args.rounds + 1):
                service = service_arm(api, spec)
                reference = torchrun_arm(spec_path, spec["scaling"]["num_workers"])
                rows.append((service, reference))
                print(
                    f"round {round_number}: service {service:.1f} samples/s, torchrun {reference:.1f} samples/s, "
                    f"ratio {service / reference:.3f}",
                    flush=True,
                )
    finally:
        cluster.stop()
    ratio = statistics.median(s / r for s, r in rows)
    print(f"median ratio service/torchrun over {len(rows)} rounds: {ratio:.3f}")


if __name__ == "__main__":
    main()
