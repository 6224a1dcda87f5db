"""How long a checkpoint blocks training, asynchronous (``checkpoint.async: true``) against synchronous.

    .venv/bin/python bench/checkpoint.py [--mb 256] [--checkpoints 4] [--train-s 4]

One Ray Train worker on a local Ray cluster (started here, 2 CPUs) holds ``--mb`` MB of state (float32) and
checkpoints it ``--checkpoints`` times the way the training loop does, on ``workers.train.ray_context.RayContext``:
synchronous, ``torch.save`` into a local folder, its manifest, then ``report``; asynchronous, a snapshot of the state
on the CPU handed to ``workers.runtime.checkpoint_writer.CheckpointWriter``, which writes and reports it in the
background. ``--train-s`` seconds of "training" (a sleep) between checkpoints, the same run once synchronous and
once asynchronous, side by side. Blocked is what the loop waits: the save and report, or the snapshot. Storage is a local folder, so here
the upload is a local copy; on a real cluster it goes to shared storage or a bucket, and only the synchronous
time grows with it. The first checkpoint of each run is left out (warm-up). Ray Train's report waits for its
controller's poll: RAY_TRAIN_HEALTH_CHECK_INTERVAL_S is the service's default (ORCHESTRATOR_TRAIN_POLL_INTERVAL_S).

Goal: asynchronous / synchronous <= 0.25 for >= 200 MB of state.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GOAL = 0.25


def checkpoint_loop(config: dict) -> None:
    """On the Ray Train worker: the checkpoints, each one's blocked seconds into ``config["out"]``."""
    import torch

    from workers.runtime.checkpoint_io import write_checkpoint_files
    from workers.runtime.checkpoint_writer import CheckpointWriter
    from workers.train.ray_context import RayContext

    ctx = RayContext()
    writer = CheckpointWriter(ctx)
    state = {"weights": torch.randn(config["mb"] * 2**20 // 4)}
    blocked = []
    for step in range(1, config["checkpoints"] + 1):
        files = {"model.pt": {**state, "step": step}}
        started = time.perf_counter()
        if config["async"]:  # the training loop's asynchronous checkpoint: a snapshot, written in the background
            writer.submit(files, {"step": step})
        else:  # its synchronous one: written and reported before training goes on
            folder = tempfile.mkdtemp(prefix="checkpoint-")
            write_checkpoint_files(folder, files, rank=ctx.rank, world_size=ctx.world_size)
            ctx.report({"step": step}, folder)
            shutil.rmtree(folder, ignore_errors=True)
        blocked.append(time.perf_counter() - started)
        state["weights"].add_(1.0)  # the next checkpoint's state differs
        time.sleep(config["train_s"])
    writer.wait()
    Path(config["out"]).write_text(json.dumps(blocked))


def run(asynchronous: bool, args, work: Path) -> list[float]:
    import ray.train
    from ray.train.torch import TorchTrainer

    out = work / f"blocked-{'async' if asynchronous else 'sync'}.json"
    config = {"mb": args.mb, "checkpoints": args.checkpoints, "train_s": args.train_s, "async": asynchronous}
    trainer = TorchTrainer(
        checkpoint_loop,
        train_loop_config={**config, "out": str(out)},
        scaling_config=ray.train.ScalingConfig(num_workers=1, resources_per_worker={"CPU": 1}),
        run_config=ray.train.RunConfig(name=out.stem, storage_path=str(work / "storage")),
    )
    trainer.fit()
    return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=256, help="MB of state (float32)")
    parser.add_argument("--checkpoints", type=int, default=4)
    parser.add_argument("--train-s", type=float, default=4.0, help="seconds of 'training' between checkpoints")
    args = parser.parse_args()

    from orchestrator.settings import Settings

    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", str(Settings().train_poll_interval_s))
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import ray

    with tempfile.TemporaryDirectory(prefix="bench-checkpoint-") as tmp:
        work = Path(tmp)
        ray.init(
            address="local", num_cpus=2, include_dashboard=False, runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}}
        )
        try:
            results = {mode: run(mode == "async", args, work) for mode in ("sync", "async")}
        finally:
            ray.shutdown()
    print(f"{args.mb} MB of state, {args.checkpoints} checkpoints, {args.train_s:g} s of training between them")
    medians = {}
    for mode, blocked in results.items():
        steady = blocked[1:] or blocked
        medians[mode] = statistics.median(steady)
        shown = ", ".join(f"{seconds:.2f}" for seconds in blocked)
        print(f"  {mode:5}: blocked {medians[mode]:.2f} s per checkpoint (median after the first; all: {shown})")
    ratio = medians["async"] / medians["sync"]
    print(f"  async / sync = {ratio:.2f} (goal <= {GOAL}: {'met' if ratio <= GOAL else 'NOT met'})")


if __name__ == "__main__":
    main()
