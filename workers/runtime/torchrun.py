"""The training loop under plain ``torchrun``, without Ray or the control plane.

    torchrun --nproc_per_node=N -m workers.runtime.torchrun --spec spec.json [--checkpoint-dir DIR] [--resume]

Reads a JobSpec JSON, resolves its TrainingPlan as the control plane does (``--strategy`` stands in
for the planner when the spec says ``auto``) and runs ``run_training`` (a training function's ``run_function``, for an ``entrypoint``) on every rank with a
``LocalContext``; events are only logged, or posted to ``--report-to`` (a stand-in control plane). It is the reference arm of ``bench/train_throughput.py``:
rank 0's last line of output is JSON with the steady-state ``samples_per_s`` (the first epoch left
out) and the last epoch's metrics.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile

import torch
import torch.distributed as dist

from orchestrator_contract.jobs import JobSpec, TrainingPlan
from workers.runtime.context import LocalContext, latest_checkpoint
from workers.runtime.function import run_function
from workers.runtime.train_loop import run_training

log = logging.getLogger("workers.runtime.torchrun")


def resolve_plan(spec: JobSpec, strategy: str | None) -> TrainingPlan:
    """The plan the control plane would record, with an explicit strategy in place of the planner's."""
    chosen = strategy or spec.strategy
    if chosen == "auto":
        raise ValueError("the spec says strategy auto: pass --strategy ddp or --strategy fsdp")
    return TrainingPlan(strategy=chosen, global_batch=spec.global_batch, lr=spec.scaled_lr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workers.runtime.torchrun", description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True, help="a JobSpec as JSON")
    parser.add_argument("--checkpoint-dir", help="where checkpoints go, the same folder for every rank")
    parser.add_argument("--resume", action="store_true", help="resume from the newest checkpoint there")
    parser.add_argument("--strategy", choices=("ddp", "fsdp"), help="overrides the spec's strategy")
    parser.add_argument(
        "--report-to", help="a URL that takes rank 0's events as the control plane would (bench/first_step.py)"
    )
    args = parser.parse_args(argv)
    if args.resume and not args.checkpoint_dir:
        parser.error("--resume needs --checkpoint-dir")
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    with open(args.spec) as file:
        spec = JobSpec.model_validate_json(file.read())
    plan = resolve_plan(spec, args.strategy)
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size != spec.scaling.num_workers:
        raise SystemExit(f"the spec asks for {spec.scaling.num_workers} workers; torchrun started {world_size}")
    device = torch.device("cpu")
    if spec.scaling.use_gpu:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    if world_size > 1:
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    try:
        with tempfile.TemporaryDirectory(prefix="torchrun-checkpoints-") as scratch:
            # Without --checkpoint-dir each rank writes into its own scratch folder, thrown away at the end.
            checkpoint_dir = args.checkpoint_dir or scratch
            resume_from = latest_checkpoint(checkpoint_dir) if args.resume else None
            config = {
                "job_id": spec.name or "torchrun",
                "attempt": 1,
                "control_plane_url": args.report_to,
                "token": "torchrun",  # what --report-to is sent (an empty bearer is no valid header)
                "spec": spec.model_dump(mode="json"),
                "plan": plan.model_dump(mode="json"),
            }
            run = run_function if spec.entrypoint else run_training  # a training function, or the loop
            metrics = run(config, LocalContext(checkpoint_dir, resume_from, device))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    if int(os.environ.get("RANK", "0")) == 0:
        print(json.dumps({"world_size": world_size, "strategy": plan.strategy, **metrics}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
