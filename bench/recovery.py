"""Recovery time and lost work after kill -9 of a training worker and of a job's driver.

    .venv/bin/python bench/recovery.py [--rounds 2] [--kill-at-step 105]

The service runs as a user runs it (``orchestrator serve`` in a subprocess, its own local Ray cluster
with 2 CPUs; the chaos tests' harness, ``tests/chaos/harness.py``) and trains the chaos tests' job
(digits, 2 workers, 356 steps, a checkpoint every 10 steps, a metric point every step). Once the job has
reported step ``--kill-at-step``, one ``RayTrainWorker`` (the worker kill: Ray Train replaces the worker
group inside the attempt) or the job's driver (the driver kill: the reconciler starts attempt 2) is
killed with SIGKILL. Measured from the kill, on the control plane's clock (the ``created_at`` the API
gives every event and metric point, which is when the control plane received it):

- RESTARTING: the job's RESTARTING event after the kill (the failure noticed: by Ray Train's controller
  for a worker, by the reconciler for a driver),
- RUNNING again: the job's RUNNING event after the kill (rank 0 sends it once the checkpoint is loaded),
- first new step: the first metric point the control plane received after that RUNNING event (after a
  worker kill, the redone steps merge into points that already exist, so this is the first step past
  the kill; after a driver kill it is the new attempt's first step),
- lost work: steps run twice (reported before the kill, then redone from the checkpoint resumed).

Target: after a worker kill, the first new step within 10 s.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.chaos.harness import ServiceProcess  # noqa: E402
from tests.chaos.recovery import CHECKPOINT_INTERVAL, inject, read_recovery, spec  # noqa: E402

TARGET_WORKER_S = 10.0


def one_kill(svc: ServiceProcess, what: str, kill_at_step: int, total_steps: int) -> dict:
    api = svc.api()
    job_id = api.submit(spec(f"bench-{what}-kill-{os.urandom(3).hex()}"))["id"]
    api.wait_for_step(job_id, kill_at_step)
    if what == "worker":
        victim = min(svc.train_worker_pids())
    else:
        victim = svc.driver_pid(f"{job_id}-1")
    kill = inject(api, job_id, what, 1, lambda: os.kill(victim, signal.SIGKILL))
    job = api.wait(job_id, {"SUCCEEDED"}, timeout_s=300)
    rec = read_recovery(svc, api, job_id, total_steps, [kill])
    noticed, resumed, first = rec.restarting_at[0], rec.resumed_at[0], rec.first_new_step_at[0]
    return {
        "what": what,
        "attempts": job["attempt"],
        "killed_at_step": kill.step_before if what == "worker" else max(rec.steps[1]),
        "resumed_from": rec.resumed_from[0].step,
        "noticed_s": noticed - kill.at if noticed else float("nan"),
        "resumed_s": resumed - kill.at if resumed else float("nan"),
        "first_step_s": first - kill.at if first else float("nan"),
        "lost_steps": rec.repeated_steps[0],
        "missing": len(rec.missing_steps),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--kill-at-step", type=int, default=10 * CHECKPOINT_INTERVAL + 5)
    parser.add_argument(
        "--setting",
        action="append",
        default=[],
        metavar="ORCHESTRATOR_X=VALUE",
        help="a service setting for this run (repeatable), e.g. ORCHESTRATOR_TRAIN_PREEMPTION_WATCHER=true",
    )
    args = parser.parse_args()

    settings = dict(pair.split("=", 1) for pair in args.setting)
    svc = ServiceProcess(Path(tempfile.mkdtemp(prefix="bench-recovery-")), settings=settings)
    rows = []
    try:
        svc.start()
        api = svc.api()
        total = api.wait(api.submit(spec("bench-warm-up"))["id"], {"SUCCEEDED"}, timeout_s=300)["result"]["metrics"][
            "step"
        ]
        for round_number in range(1, args.rounds + 1):
            for what in ("worker", "driver"):
                row = one_kill(svc, what, args.kill_at_step, total)
                rows.append(row)
                print(
                    f"round {round_number}: {what} kill at step {row['killed_at_step']}: RESTARTING after "
                    f"{row['noticed_s']:.1f} s, RUNNING after {row['resumed_s']:.1f} s, first new step after "
                    f"{row['first_step_s']:.1f} s; resumed from step {row['resumed_from']}, "
                    f"{row['lost_steps']} steps lost",
                    flush=True,
                )
    finally:
        svc.stop()

    print(
        "\n| kill | rounds | RESTARTING (s) | RUNNING again (s) | first new step (s) | lost work (steps) | attempts |"
    )
    print("|---|---|---|---|---|---|---|")
    for what in ("worker", "driver"):
        mine = [r for r in rows if r["what"] == what]

        def column(key: str, form: str = "{:.1f}") -> str:
            return ", ".join(form.format(r[key]) for r in mine)  # noqa: B023

        print(
            f"| {what} | {len(mine)} | {column('noticed_s')} | {column('resumed_s')} | {column('first_step_s')} "
            f"| {column('lost_steps', '{}')} | {column('attempts', '{}')} |"
        )
    worker = [r["first_step_s"] for r in rows if r["what"] == "worker"]
    worst = max(worker)
    print(
        f"\nworker kill: first new step after {statistics.median(worker):.1f} s (median), {worst:.1f} s "
        f"(worst); target <= {TARGET_WORKER_S:.0f} s: {'met' if worst <= TARGET_WORKER_S else 'NOT met'}"
    )
    if any(r["missing"] for r in rows):
        print("WARNING: some steps were never reported:", [r for r in rows if r["missing"]])


if __name__ == "__main__":
    main()
