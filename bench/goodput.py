"""Goodput under a scripted fault mix, against the same job without faults, side by side in one run.

    .venv/bin/python bench/goodput.py [--steps 60] [--step-s 0.4] [--checkpoint-every 5]

The service runs as a user runs it (``orchestrator serve`` in a subprocess, its own local Ray cluster of 2 CPUs:
the chaos tests' harness). The job is a training function of 2 workers that runs ``--steps`` steps of
``--step-s`` seconds (an all-reduce and a report each), a checkpoint every ``--checkpoint-every`` steps,
``failure.hang_timeout_s`` 10. First without faults, then with: rank 0 hangs once (a sleep) at a third of the
steps, rank 1 straggles (twice the step time) for a sixth of the steps from half-way, and a training worker is
killed with SIGKILL at two thirds. For each: the wall time from submit to
SUCCEEDED, and ``GET /v1/jobs/{id}/goodput`` (kept training over held time, the lost time by cause).

Goodput of the faulty run against the clean one: clean wall / faulty wall. The straggler's cost shows only there:
a training function's ranks are not timed one by one (straggler detection covers the built-in loop), and its
slower steps are kept training to ``GET /goodput``.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.chaos.harness import ServiceProcess  # noqa: E402
from tests.hanging_function import ENTRYPOINT, code_zip  # noqa: E402


def upload(api) -> str:
    response = api.http.post("/v1/code", files={"file": ("code.zip", code_zip())})
    response.raise_for_status()
    return response.json()["id"]


def run_job(svc: ServiceProcess, code_id: str, args, name: str, faults: bool, work: Path) -> dict:
    api = svc.api()
    config = {
        "steps": args.steps,
        "step_s": args.step_s,
        "checkpoint_every": args.checkpoint_every,
        "hang_at": args.steps // 3 if faults else 0,
        "marker": str(work / f"{name}-hung"),
        "slow_rank": 1 if faults else -1,
        "slow_s": args.step_s,
        "slow_from": args.steps // 2,
        "slow_to": args.steps // 2 + args.steps // 6,
    }
    spec = {
        "name": name,
        "entrypoint": ENTRYPOINT,
        "code": {"id": code_id},
        "config": config,
        "scaling": {"num_workers": 2},
        "failure": {"hang_timeout_s": 10},
        "retries": {"max_attempts": 3, "max_worker_restarts": 2},
    }
    started = time.monotonic()
    job_id = api.submit(spec)["id"]
    if faults:
        api.wait_for_step(job_id, 2 * args.steps // 3, timeout_s=600)
        os.kill(min(svc.train_worker_pids()), signal.SIGKILL)
    job = api.wait(job_id, {"SUCCEEDED"}, timeout_s=900)
    wall = time.monotonic() - started
    goodput = api.http.get(f"/v1/jobs/{job_id}/goodput").json()
    return {"name": name, "wall_s": wall, "attempts": job["attempt"], **goodput}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--step-s", type=float, default=0.4)
    parser.add_argument("--checkpoint-every", type=int, default=5)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-goodput-"))
    svc = ServiceProcess(work / "service")
    try:
        svc.start()
        code_id = upload(svc.api())
        rows = [
            run_job(svc, code_id, args, name, faults, work) for name, faults in (("clean", False), ("faulty", True))
        ]
    finally:
        svc.stop()
    print(f"{args.steps} steps of {args.step_s:g} s, a checkpoint every {args.checkpoint_every}, 2 workers\n")
    print(
        "| run | wall (s) | attempts | goodput | held (s) | kept (s) | start-up | restarts | hangs | recomputed "
        "| checkpoint blocking |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        lost = row["lost"]
        print(
            f"| {row['name']} | {row['wall_s']:.1f} | {row['attempts']} | {row['goodput']:.2f} | {row['held_s']:.1f} "
            f"| {row['kept_s']:.1f} | {lost['start_up_s']:.1f} | {lost['restarts_s']:.1f} | {lost['hangs_s']:.1f} "
            f"| {lost['recomputed_s']:.1f} | {lost['checkpoint_blocking_s']:.1f} |"
        )
    clean, faulty = rows
    print(
        f"\ngoodput of the faulty run against the clean one (clean wall / faulty wall): "
        f"{clean['wall_s'] / faulty['wall_s']:.2f}"
    )


if __name__ == "__main__":
    main()
