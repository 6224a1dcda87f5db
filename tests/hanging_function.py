"""A training function that hangs on purpose (rank 0 sleeps at a chosen step), uploaded as a job's own code by the
hang tests (tests/integration/test_hangs_on_ray.py) and bench/goodput.py. Its module is ``hangs`` (``hangs:main``).

Config: ``steps``; ``hang_at`` (0: never); ``marker``, a file that says it already hung (once only, unless
``always``; a sweep's trials: ``mode`` "once" or "always", which also tells their markers apart);
``steps_per_epoch`` (a sweep trial's epochs); ``step_s``, seconds of "training" a step; ``checkpoint_every`` steps; a straggler: rank ``slow_rank``
sleeps ``slow_s`` more a step in steps [``slow_from``, ``slow_to``) (the others wait for it at the next
all-reduce)."""

from __future__ import annotations

import io
import zipfile

SOURCE = '''
import os
import tempfile
import time

import torch
import torch.distributed as dist


def main(ctx):
    """One all-reduce and one report a step, a checkpoint every checkpoint_every steps; rank 0 sleeps at step
    hang_at (once only, when a marker file says it already did, unless "always")."""
    c = ctx.config
    marker, always = c["marker"] + c.get("mode", ""), c.get("always") or c.get("mode") == "always"
    start = 0
    if (folder := ctx.restore()) is not None:
        with open(os.path.join(folder, "step.txt")) as saved:
            start = int(saved.read())
    for step in range(start + 1, c["steps"] + 1):
        epoch = None if "steps_per_epoch" not in c else step // c["steps_per_epoch"]  # a sweep's trial counts epochs
        total = torch.tensor([float(step)])
        dist.all_reduce(total)
        if ctx.rank == 0 and step == c["hang_at"] and (always or not os.path.exists(marker)):
            open(marker, "w").close()
            time.sleep(3600)
        time.sleep(c.get("step_s", 0.2))
        if ctx.rank == c.get("slow_rank", -1) and c.get("slow_from", 0) <= step < c.get("slow_to", 0):
            time.sleep(c["slow_s"])
        if step % c.get("checkpoint_every", 2) == 0:
            with tempfile.TemporaryDirectory() as checkpoint:
                with open(os.path.join(checkpoint, "step.txt"), "w") as out:
                    out.write(str(step))
                ctx.report({"total": total.item()}, checkpoint_dir=checkpoint, step=step, epoch=epoch)
        else:
            ctx.report({"total": total.item()}, step=step, epoch=epoch)

'''
ENTRYPOINT = "hangs:main"


def code_zip() -> bytes:
    """The function as a code package (POST /v1/code)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("hangs.py", SOURCE)
    return buffer.getvalue()
