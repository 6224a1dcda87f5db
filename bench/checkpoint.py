"""How long a checkpoint blocks training, asynchronous (``checkpoint.async: true``) against synchronous.

    .venv/bin/python bench/checkpoint.py [--mb 256] [--checkpoints 4] [--train-s 4] [--strategy ddp|fsdp]

One Ray Train worker on a local Ray cluster (started here, 2 CPUs) holds ``--mb`` MB of state (float32) and
checkpoints it ``--checkpoints`` times the way the training loop does, on ``workers.train.ray_context.RayContext``:
synchronous, ``torch.save`` into a local folder, its manifest, then ``report``; asynchronous, a snapshot of the state
on the CPU handed to ``workers.runtime.checkpoint_writer.CheckpointWriter``, which writes and reports it in the
background. ``--train-s`` seconds of "training" (a sleep) between checkpoints, the same run once synchronous and
once asynchronous, side by side. Blocked is what the loop waits: the save and report, or the snapshot. Storage is a local folder, so here
the upload is a local copy; on a real cluster it goes to shared storage or a bucket, and only the synchronous
time grows with it. The first checkpoint of each run is left out (warm-up). Ray Train's report waits for its
controller's poll: RAY_TRAIN_HEALTH_CHECK_INTERVAL_S is the service's default (ORCHESTRATOR_TRAIN_POLL_INTERVAL_S).

``--strategy fsdp``: no Ray; 2 gloo processes (``torch.multiprocessing``, ``LocalContext``) hold a model of
``--mb`` MB of float32 parameters sharded with FSDP2 and its AdamW moments (twice as much again), each rank half
of it, and checkpoint it as the loop does: synchronous, ``checkpoint_io.save_checkpoint`` (the sharded state dict
and the gathered ``model.pt``, DCP's ``save`` on the training group, the other files, the manifest) then
``report``; asynchronous, ``checkpoint_state`` (the same collectives, on the loop) then ``CheckpointWriter.submit``
(a snapshot of each rank's shards, saved with DCP on the writer's own gloo group in the background). Blocked is
rank 0's.

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


def fsdp_checkpoint_loop(rank: int, config: dict) -> None:
    """On each of 2 gloo ranks: an FSDP2 model and its optimizer, checkpointed as the loop does; rank 0's blocked
    seconds into ``config["out"]``."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from workers.runtime.checkpoint_io import Position, checkpoint_state, save_checkpoint
    from workers.runtime.checkpoint_writer import CheckpointWriter
    from workers.runtime.context import LocalContext
    from workers.runtime.step import TrainState

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{config['store']}", rank=rank, world_size=2)
    try:
        width, layers = 1024, max(1, config["mb"] * 2**20 // (4 * 1024 * 1024))  # 4 MB per 1024 x 1024 layer
        torch.manual_seed(0)
        model = nn.Sequential(*(nn.Linear(width, width, bias=False) for _ in range(layers)))
        mesh = init_device_mesh("cpu", (2,))
        for layer in model:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        model(torch.randn(2, width)).sum().backward()
        optimizer.step()  # its moments exist: the checkpoint holds them
        optimizer.zero_grad()
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
        state = TrainState(model, optimizer, scheduler, torch.amp.GradScaler("cpu", enabled=False))
        ctx = LocalContext(Path(config["root"]))
        writer = CheckpointWriter(ctx, process_group=dist.new_group(backend="gloo") if config["async"] else None)
        blocked = []
        for step in range(1, config["checkpoints"] + 1):
            position, epoch_loss = Position(1, step, step), torch.zeros(2, dtype=torch.float64)
            dist.barrier()
            started = time.perf_counter()
            if config["async"]:
                files, sharded = checkpoint_state(
                    rank=rank, strategy="fsdp", state=state, position=position, epoch_loss=epoch_loss
                )
                writer.submit(files, {"step": step}, sharded)
            else:
                folder = tempfile.mkdtemp(prefix="checkpoint-")
                save_checkpoint(
                    folder,
                    rank=rank,
                    world_size=2,
                    strategy="fsdp",
                    state=state,
                    position=position,
                    epoch_loss=epoch_loss,
                )
                ctx.report({"step": step}, folder)
                shutil.rmtree(folder, ignore_errors=True)
            blocked.append(time.perf_counter() - started)
            with torch.no_grad():  # the next checkpoint's state differs
                for parameter in model.parameters():
                    parameter.add_(1.0)
            time.sleep(config["train_s"])
        writer.wait()
        if rank == 0:
            Path(config["out"]).write_text(json.dumps(blocked))
    finally:
        dist.destroy_process_group()


def run_fsdp(asynchronous: bool, args, work: Path) -> list[float]:
    import torch.multiprocessing as mp

    mode = "async" if asynchronous else "sync"
    out = work / f"blocked-fsdp-{mode}.json"
    config = {"mb": args.mb, "checkpoints": args.checkpoints, "train_s": args.train_s, "async": asynchronous}
    config.update(out=str(out), store=str(work / f"store-{mode}"), root=str(work / f"storage-{mode}"))
    mp.start_processes(fsdp_checkpoint_loop, args=(config,), nprocs=2, start_method="spawn")
    return json.loads(out.read_text())


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
    parser.add_argument("--strategy", choices=["ddp", "fsdp"], default="ddp", help="fsdp: 2 gloo processes, no Ray")
    args = parser.parse_args()
    if args.strategy == "fsdp":
        os.environ["OMP_NUM_THREADS"] = "1"  # inherited by the 2 ranks: 2 cores
        with tempfile.TemporaryDirectory(prefix="bench-checkpoint-") as tmp:
            results = {mode: run_fsdp(mode == "async", args, Path(tmp)) for mode in ("sync", "async")}
        report(results, args, f"{args.mb} MB of parameters + AdamW moments, FSDP2 over 2 gloo ranks")
        return

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
    report(results, args, f"{args.mb} MB of state")


def report(results: dict[str, list[float]], args, what: str) -> None:
    print(f"{what}, {args.checkpoints} checkpoints, {args.train_s:g} s of training between them")
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
