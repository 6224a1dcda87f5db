"""What ASHA saves over FIFO on the same seeded search: trial-epochs used and best accuracy reached.

    .venv/bin/python bench/asha_savings.py [--trials 16] [--epochs 16] [--seed 3] [--reduction-factor 4]

The service runs as a user runs it (``orchestrator serve`` in a subprocess with its own 2-CPU local Ray
cluster; ``tests/chaos/harness.py``). Two sweeps over the same space with the same seed (so Tune's seeded
random search samples the same configurations; the bench checks they match) run one after the other,
two 2-worker digits trials at a time: one with the FIFO scheduler (every trial runs every epoch), one with
ASHA (max_t = epochs, grace period 1, reduction factor 4 unless told). Printed: total trial-epochs and the best
val_accuracy of each, and ASHA's over FIFO's.

Target: ASHA uses <= 1/3 of FIFO's trial-epochs and reaches >= 0.99 of its best val_accuracy.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.chaos.harness import ServiceProcess  # noqa: E402

SPACE = {
    "lr.base": {"type": "loguniform", "low": 1e-4, "high": 0.5},
    "config.hidden": {"type": "choice", "values": [8, 16, 32, 64]},
}


def run_sweep(api, scheduler: dict, trials: int, epochs: int, seed: int) -> dict:
    spec = {
        "name": f"bench-{scheduler['type']}",
        "base": {"workload": "digits", "epochs": epochs, "scaling": {"num_workers": 2, "cpus_per_worker": 0.45}},
        "search_space": SPACE,
        "algorithm": "random",
        "scheduler": scheduler,
        "metric": "val_accuracy",
        "num_samples": trials,
        "max_concurrent_trials": 2,
        "seed": seed,
    }
    started = time.monotonic()
    response = api.http.post("/v1/sweeps", json=spec)
    response.raise_for_status()
    sweep_id = response.json()["id"]
    while (sweep := api.http.get(f"/v1/sweeps/{sweep_id}").json())["state"] not in {"SUCCEEDED", "FAILED", "CANCELLED"}:
        time.sleep(2)
    if sweep["state"] != "SUCCEEDED":
        raise SystemExit(f"the {scheduler['type']} sweep ended {sweep['state']}: {sweep['message']}")
    trials_out = api.http.get(f"/v1/sweeps/{sweep_id}/trials").json()
    return {
        "scheduler": scheduler["type"],
        "seconds": time.monotonic() - started,
        "trials": len(trials_out),
        "stopped_early": sum(t["stopped_early"] for t in trials_out),
        "epochs": sum(t["iterations"] for t in trials_out),
        "best": sweep["best_trial"]["metric"],
        "best_config": sweep["best_trial"]["config"],
        "configs": sorted(tuple(sorted(t["config"].items())) for t in trials_out),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=16)
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--reduction-factor", type=int, default=4, help="ASHA keeps the top 1/this at each rung")
    args = parser.parse_args()

    svc = ServiceProcess(Path(tempfile.mkdtemp(prefix="bench-asha-")))
    try:
        svc.start()
        api = svc.api()
        fifo = run_sweep(api, {"type": "fifo"}, args.trials, args.epochs, args.seed)
        asha = run_sweep(
            api,
            {"type": "asha", "max_t": args.epochs, "grace_period": 1, "reduction_factor": args.reduction_factor},
            args.trials,
            args.epochs,
            args.seed,
        )
    finally:
        svc.stop()

    same = fifo["configs"] == asha["configs"]
    print("\n| scheduler | trials | stopped early | trial-epochs | best val_accuracy | wall (s) |")
    print("|---|---|---|---|---|---|")
    for row in (fifo, asha):
        print(
            f"| {row['scheduler']} | {row['trials']} | {row['stopped_early']} | {row['epochs']} | {row['best']:.4f} "
            f"| {row['seconds']:.0f} |"
        )
    epochs_ratio, best_ratio = asha["epochs"] / fifo["epochs"], asha["best"] / fifo["best"]
    print(f"\nsame configurations in both sweeps: {same}")
    print(
        f"ASHA / FIFO trial-epochs: {epochs_ratio:.3f} (target <= 0.333: {'met' if epochs_ratio <= 1 / 3 else 'NOT met'})"
    )
    print(
        f"ASHA / FIFO best val_accuracy: {best_ratio:.4f} (target >= 0.99: {'met' if best_ratio >= 0.99 else 'NOT met'})"
    )
    print(f"wall time ASHA / FIFO: {asha['seconds'] / fifo['seconds']:.2f}")
    print(f"best config: FIFO {fifo['best_config']}, ASHA {asha['best_config']}")


if __name__ == "__main__":
    main()
