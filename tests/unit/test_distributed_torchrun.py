"""``python -m workers.runtime.torchrun`` under a real ``torchrun`` with 2 CPU ranks (the benchmark's reference arm)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.unit.harness import TRANSFORMER, job_config

ROOT = Path(__file__).resolve().parents[2]


def torchrun(spec: dict, *args: str, cwd: Path) -> dict:
    (cwd / "spec.json").write_text(json.dumps(spec))
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        "-m",
        "workers.runtime.torchrun",
        "--spec",
        str(cwd / "spec.json"),
        *args,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_fsdp_under_torchrun_reports_throughput_and_resumes(tmp_path):
    spec = job_config(TRANSFORMER, strategy="fsdp", epochs=2, batch={"per_worker": 8})["spec"]
    spec["strategy"] = "auto"  # the entry resolves it with --strategy, as the planner would
    checkpoints = tmp_path / "checkpoints"
    first = torchrun(spec, "--strategy", "fsdp", "--checkpoint-dir", str(checkpoints), cwd=tmp_path)
    assert first["world_size"] == 2 and first["strategy"] == "fsdp"
    assert first["samples_per_s"] > 0 and first["val_loss"] > 0
    assert sorted(p.name for p in checkpoints.iterdir()) == ["checkpoint_000000004", "checkpoint_000000008"]

    written = {p: p.stat().st_mtime_ns for p in checkpoints.rglob("*") if p.is_file()}

    spec["epochs"] = 3
    torchrun(spec, "--strategy", "fsdp", "--checkpoint-dir", str(checkpoints), "--resume", cwd=tmp_path)
    assert {p: p.stat().st_mtime_ns for p in written} == written  # epochs 1 and 2 were not run again
    latest = checkpoints / "checkpoint_000000012"  # the third epoch: 4 more steps
    assert sorted(p.name for p in (latest / "sharded").iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
