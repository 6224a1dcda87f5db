"""Submit -> first training step, three ways side by side: through the service, Ray Train's ``TorchTrainer.fit()``
called directly, and plain ``torchrun`` (issue 34; docs/benchmarks.md "First step").

    OMP_NUM_THREADS=1 .venv/bin/python bench/first_step.py [--rounds 5]

The same job every time: digits, 1 epoch, 2 CPU workers x 8 samples, the same loop (``run_training``). The service
runs as a user runs it (``orchestrator serve`` in a subprocess with its own 2-CPU local Ray cluster: the chaos
tests' harness). The three arms, alternating which goes first in each round, one warm-up of each first:

- service: ``POST /v1/jobs``, then the job's start-up timeline (``GET /v1/jobs/{id}``: ``startup``) until
  ``first_step``; the job is then cancelled. Its stages' medians are printed too: where the seconds go.
- TorchTrainer: a new Python process (as a user's script) that joins the service's Ray cluster and calls
  ``build_trainer(...).fit()``, the service's own trainer with no control plane around it.
- torchrun: ``torchrun --nproc-per-node 2 -m workers.runtime.torchrun``: the loop with no Ray at all.

Each is timed on this machine's clock from the moment the bench asks (the POST, the process start) to the arrival
of rank 0's ``first_step`` event: at the service, or, for the other two, at a stand-in control plane in this
process that takes their events (``--report-to``). Goals (issue 34): service / torchrun <= 1.5, service /
TorchTrainer <= 0.5. Prints each run, the medians and the ratios.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SPEC = {
    "workload": "digits",
    "epochs": 1,
    "seed": 7,
    "strategy": "ddp",
    "scaling": {"num_workers": 2},
    "batch": {"per_worker": 8},
    "metrics_every_steps": 1,
}
ARMS = ("service", "TorchTrainer", "torchrun")
GOALS = {"torchrun": 1.5, "TorchTrainer": 0.5}  # service / arm
FIRST_STEP_TIMEOUT_S = 300
SETTLE_S = 3.0


class StandIn(http.server.BaseHTTPRequestHandler):
    """Takes rank 0's events as the control plane would, and keeps when each start-up stage arrived, by run."""

    arrivals: dict[str, dict[str, float]] = {}
    lock = threading.Lock()

    def do_POST(self) -> None:
        at = time.time()
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        run = self.path.split("/")[4]  # /internal/v1/jobs/<run>/events
        with self.lock:
            stages = self.arrivals.setdefault(run, {})
            for event in body.get("events", []):
                if event.get("type") == "startup":
                    stages.setdefault(event["stage"], at)
        data = json.dumps({"received": len(body.get("events", [])), "applied": 0}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


def reached(run: str, stage: str = "first_step") -> float | None:
    with StandIn.lock:
        return StandIn.arrivals.get(run, {}).get(stage)


def wait_for_first_step(run: str, process: subprocess.Popen) -> float:
    deadline = time.monotonic() + FIRST_STEP_TIMEOUT_S
    while (at := reached(run)) is None:
        if process.poll() is not None:
            raise RuntimeError(f"{run}: the process ended ({process.returncode}) before its first step")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{run}: no first step after {FIRST_STEP_TIMEOUT_S} s")
        time.sleep(0.02)
    return at


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def service_arm(api, name: str) -> tuple[float, dict[str, float]]:
    from tests.chaos.harness import TERMINAL
    from tests.chaos.recovery import parse_time

    asked = time.time()
    job = api.submit({**SPEC, "name": name})
    deadline = time.monotonic() + FIRST_STEP_TIMEOUT_S
    while True:
        body = api.job(job["id"])
        stages = {s["stage"]: s for s in (body["startup"][-1]["stages"] if body["startup"] else [])}
        if "first_step" in stages:
            break
        if body["state"] in TERMINAL or time.monotonic() > deadline:
            raise RuntimeError(f"{name}: no first step: {body['state']} {body['message'][-500:]}")
        time.sleep(0.05)
    seconds = parse_time(stages["first_step"]["at"]) - asked
    breakdown = {"submit": parse_time(stages["admitted"]["at"]) - asked}
    breakdown.update({stage: entry["after_s"] for stage, entry in stages.items()})
    api.http.post(f"/v1/jobs/{job['id']}/cancel")
    api.wait(job["id"], {"CANCELLED", "SUCCEEDED"}, timeout_s=120)
    return seconds, breakdown


def trainer_arm(svc, url: str, name: str) -> float:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "PYTEST"))},
        "OMP_NUM_THREADS": "1",
        "RAY_ADDRESS": svc.gcs_address,
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": str(svc.var / "ray" / "auth_token"),
        "RAY_TMPDIR": svc.settings["RAY_TMPDIR"],
    }
    asked = time.time()
    command = [sys.executable, __file__, "--trainer-run", name, "--report-to", url]
    process = subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        return wait_for_first_step(name, process) - asked
    finally:
        stop(process)


def torchrun_arm(url: str, name: str, folder: Path) -> float:
    spec = folder / f"{name}.json"
    spec.write_text(json.dumps({**SPEC, "name": name}))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    command += ["-m", "workers.runtime.torchrun", "--spec", str(spec), "--report-to", url]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    asked = time.time()
    process = subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        return wait_for_first_step(name, process) - asked
    finally:
        stop(process)


def settle() -> None:
    """The arm before let go of its workers (a cancelled job's Ray job, a killed driver's actors): Ray frees them
    within a second or two; the next arm must not wait for them."""
    time.sleep(SETTLE_S)


def trainer_run(name: str, url: str) -> None:
    """``--trainer-run``: the TorchTrainer arm's own process, as a user's script on the cluster."""
    import ray

    from orchestrator_contract.jobs import JobSpec, TrainingPlan
    from workers.train.trainer import build_trainer

    ray.init(address=os.environ["RAY_ADDRESS"], logging_level="WARNING", log_to_driver=False)
    spec = JobSpec.model_validate({**SPEC, "name": name})
    plan = TrainingPlan(strategy="ddp", global_batch=spec.global_batch, lr=spec.scaled_lr)
    storage = tempfile.mkdtemp(prefix="first-step-trainer-")
    build_trainer(
        job_id=name, attempt=1, spec=spec, plan=plan, storage_path=storage, control_plane_url=url, token="bench"
    ).fit()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--trainer-run", help=argparse.SUPPRESS)
    parser.add_argument("--report-to", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.trainer_run:
        trainer_run(args.trainer_run, args.report_to)
        return

    from tests.chaos.harness import ServiceProcess

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), StandIn)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}"
    # A Ray temp dir of its own (see bench/own_code.py): short, Ray's socket paths live under it.
    ray_tmp = tempfile.mkdtemp(prefix="fs-", dir="/tmp")
    folder = Path(tempfile.mkdtemp(prefix="bench-first-step-"))
    svc = ServiceProcess(folder / "service", settings={"RAY_TMPDIR": ray_tmp})
    times: dict[str, list[float]] = {arm: [] for arm in ARMS}
    stages: dict[str, list[float]] = {}
    try:
        svc.start()
        api = svc.api()

        def run(arm: str, name: str) -> float:
            if arm == "service":
                seconds, breakdown = service_arm(api, name)
                if not name.startswith("warm"):
                    for stage, value in breakdown.items():
                        stages.setdefault(stage, []).append(value)
            elif arm == "TorchTrainer":
                seconds = trainer_arm(svc, url, name)
            else:
                seconds = torchrun_arm(url, name, folder)
            settle()
            return seconds

        for arm in ARMS:  # warm-up: imports and Ray's worker processes
            print(f"warm-up {arm}: {run(arm, f'warm-{arm.lower()}'):.2f} s", flush=True)
        for number in range(1, args.rounds + 1):
            shift = (number - 1) % len(ARMS)
            for arm in ARMS[shift:] + ARMS[:shift]:
                seconds = run(arm, f"r{number}-{arm.lower()}")
                times[arm].append(seconds)
                print(f"round {number}: {arm}: submit -> first step {seconds:.2f} s", flush=True)
    finally:
        svc.stop()
        server.shutdown()

    print("\n| arm | submit -> first step (s), per round | median (s) |")
    print("|---|---|---|")
    for arm in ARMS:
        print(f"| {arm} | {', '.join(f'{t:.2f}' for t in times[arm])} | {statistics.median(times[arm]):.2f} |")
    service = statistics.median(times["service"])
    for arm, goal in GOALS.items():
        ratio = service / statistics.median(times[arm])
        print(f"service / {arm} (medians): {ratio:.2f}; goal <= {goal}: {'met' if ratio <= goal else 'NOT met'}")
    print("\nThe service's start, median seconds (submit: the POST to admitted; each stage: after admitted):")
    for stage, values in stages.items():
        print(f"  {stage:<20} {statistics.median(values):6.2f}")


if __name__ == "__main__":
    main()
