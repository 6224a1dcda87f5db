"""Preemption: how long a high-priority job waits for its first step when a victim must be preempted first,
against the same job on an idle cluster, side by side in one run; and the victim's lost work.

    flock /tmp/ray-cluster.lock env OMP_NUM_THREADS=1 .venv/bin/python bench/preemption.py [--rounds 2]

The service runs as a user runs it (``orchestrator serve`` in a subprocess with its own local Ray cluster of
2 CPUs; the chaos tests' harness, ``tests/chaos/harness.py``). Every job is digits with 2 workers of 1 CPU
(the whole cluster), a metric point every step. Each round, in alternating order:

- idle: the high-priority job (priority 10) is submitted to an idle cluster;
- preempting: a low-priority job (priority 0) is running and has reported step ``--victim-step``; the same
  high-priority job is submitted: the scheduler preempts the low one, which checkpoints at its next step and
  stops; its Ray job ends, the high one is admitted and starts.

Measured on the control plane's clock (the ``created_at`` the API gives a job, its events and its metric
points): submit -> the high job's first metric point (its first step); for the preempting arm also submit ->
the victim back in QUEUED (checkpointed and stopped) and, once the victim is admitted again and resumes,
its lost work: steps it reported before the preemption that it runs again (its last step of attempt 1
minus the step its attempt 2 resumed from). The ratio is preempting / idle, per round and of the medians.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.chaos.harness import ServiceProcess  # noqa: E402
from tests.chaos.recovery import parse_time  # noqa: E402

SPEC = {
    "workload": "digits",
    "seed": 5,
    "scaling": {"num_workers": 2},
    "batch": {"per_worker": 8},  # 89 steps an epoch
    "metrics_every_steps": 1,
    "checkpoint": {"every_epochs": 1, "every_steps": None, "keep": 2},
}


def steps(api, job_id: str) -> dict[int, list[tuple[int, float]]]:
    """attempt -> [(step, received at)] in step order."""
    by_attempt: dict[int, list[tuple[int, float]]] = {}
    for point in api.metrics(job_id):
        by_attempt.setdefault(point["attempt"], []).append((point["step"], parse_time(point["created_at"])))
    return {a: sorted(points) for a, points in by_attempt.items()}


def first_step_at(api, job_id: str, timeout_s: float = 300) -> float:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        points = [p for attempt in steps(api, job_id).values() for p in attempt]
        if points:
            return min(at for _, at in points)
        job = api.job(job_id)
        if job["state"] in ("FAILED", "CANCELLED"):
            raise AssertionError(f"job {job_id} ended {job['state']}: {job['message'][-2000:]}")
        time.sleep(0.2)
    raise AssertionError(f"job {job_id}: no step within {timeout_s} s")


def idle(api, name: str) -> dict:
    job = api.submit({**SPEC, "name": name, "epochs": 1, "priority": 10})
    submitted = parse_time(job["created_at"])
    first = first_step_at(api, job["id"])
    api.wait(job["id"], {"SUCCEEDED"}, timeout_s=300)
    return {"first_step_s": first - submitted}


def preempting(api, name: str, victim_step: int) -> dict:
    victim = api.submit({**SPEC, "name": f"{name}-victim", "epochs": 4, "priority": 0})
    api.wait_for_step(victim["id"], victim_step)
    job = api.submit({**SPEC, "name": name, "epochs": 1, "priority": 10})
    submitted = parse_time(job["created_at"])
    first = first_step_at(api, job["id"])
    api.wait(job["id"], {"SUCCEEDED"}, timeout_s=300)
    requeued = next(e for e in api.events(victim["id"]) if e["to_state"] == "QUEUED" and e["from_state"] is not None)
    # The victim is admitted again and resumes: its lost work is known at its first new step.
    deadline = time.monotonic() + 300
    while len(by_attempt := steps(api, victim["id"])) < 2:
        if time.monotonic() > deadline:
            raise AssertionError(f"victim {victim['id']} did not resume: {api.job(victim['id'])}")
        time.sleep(0.5)
    api.http.post(f"/v1/jobs/{victim['id']}/cancel")  # its remaining epochs measure nothing
    api.wait(victim["id"], {"CANCELLED", "SUCCEEDED"}, timeout_s=120)
    last_before = by_attempt[1][-1][0]
    resumed_from = by_attempt[2][0][0] - 1
    return {
        "first_step_s": first - submitted,
        "requeued_s": parse_time(requeued["created_at"]) - submitted,
        "checkpointed": "checkpointed and stopped" in requeued["message"],
        "victim_stopped_at": last_before,
        "lost_steps": last_before - resumed_from,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--victim-step", type=int, default=30)
    args = parser.parse_args()

    svc = ServiceProcess(Path(tempfile.mkdtemp(prefix="bench-preemption-")))
    rows: list[tuple[str, dict]] = []
    started = time.monotonic()
    try:
        svc.start()
        api = svc.api()
        idle(api, "warm-up")  # the digits cache, Ray's worker pool: neither arm pays for them
        for round_number in range(1, args.rounds + 1):
            arms = ("idle", "preempting") if round_number % 2 else ("preempting", "idle")
            for arm in arms:
                name = f"bench-{arm}-{round_number}"
                row = idle(api, name) if arm == "idle" else preempting(api, name, args.victim_step)
                rows.append((arm, row))
                print(f"round {round_number} {arm}: {row}", flush=True)
    finally:
        svc.stop()

    idle_s = [r["first_step_s"] for arm, r in rows if arm == "idle"]
    pre = [r for arm, r in rows if arm == "preempting"]
    pre_s = [r["first_step_s"] for r in pre]
    print("\n| arm | rounds | submit -> first step (s) | submit -> victim QUEUED (s) | victim lost work (steps) |")
    print("|---|---|---|---|---|")
    print(f"| idle cluster | {len(idle_s)} | {', '.join(f'{s:.1f}' for s in idle_s)} | - | - |")
    print(
        f"| preempting a victim | {len(pre)} | {', '.join(f'{s:.1f}' for s in pre_s)} "
        f"| {', '.join(format(r['requeued_s'], '.1f') for r in pre)} "
        f"| {', '.join(str(r['lost_steps']) for r in pre)} (stopped at step "
        f"{', '.join(str(r['victim_stopped_at']) for r in pre)}) |"
    )
    ratio = statistics.median(pre_s) / statistics.median(idle_s)
    print(
        f"\nratio preempting / idle (medians): {ratio:.2f} ({statistics.median(pre_s):.1f} s vs "
        f"{statistics.median(idle_s):.1f} s); every victim checkpointed before stopping: "
        f"{all(r['checkpointed'] for r in pre)}; whole run {time.monotonic() - started:.0f} s"
    )


if __name__ == "__main__":
    main()
