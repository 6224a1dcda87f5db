"""Asynchronous checkpoints off the training loop (``checkpoint.async``, docs/jobs.md "Asynchronous checkpoints").

The loop hands over its live state; ``submit`` copies it to the CPU (``checkpoint_io.snapshot``, into the
previous snapshot's buffers), which is all the loop waits for, and the loop trains on; one background thread per rank
writes the files and the manifest into a local folder and reports it through the loop's context, synchronously
there, so the checkpoint is committed when the thread ends. At most one is in flight: the next checkpoint, a
synchronous one and the end of training wait for it, and an error in the thread is raised on the loop at that wait
(a checkpoint is never lost silently).

FSDP: the loop hands over its sharded state dict too (DTensors, ``checkpoint_io.checkpoint_state``: getting it and
gathering ``model.pt`` are collectives on the training group, so they run on the loop); the snapshot copies this
rank's local shards, and the thread saves them with DCP (``dcp.save``, a collective) before the other files and the
manifest, on ``process_group``: a gloo group of the writer's own, never the training group, whose collectives the
loop is running meanwhile. As ``torch.distributed.checkpoint.async_save`` does (stage to CPU, save in a thread, on
a CPU group), with the manifest and the report after the shards in the same thread.

Every rank submits and waits at the same steps, so the contexts' own synchronisation (Ray Train's report
barrier, an actor; ``LocalContext``'s barrier on its own process group) and DCP's run on these threads, never
beside a training collective on the loop's group.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from typing import Any

from workers.runtime.checkpoint_io import snapshot, write_checkpoint_files
from workers.runtime.context import LoopContext
from workers.runtime.distributed import is_distributed


class CheckpointWriter:
    def __init__(self, ctx: LoopContext, process_group: Any = None) -> None:
        self.ctx = ctx
        # DCP's collectives for a sharded (FSDP) checkpoint: a group of their own, created by every rank at the
        # same point (``dist.new_group(backend="gloo")``); None without a process group.
        self.process_group = process_group
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._buffers: dict[tuple, Any] = {}  # the last snapshot's host storages, reused by the next

    def submit(self, files: dict[str, Any], metrics: dict[str, Any], sharded: dict[str, Any] | None = None) -> None:
        """Snapshot ``files`` and ``sharded`` (``checkpoint_io.checkpoint_state``: the live state), then write and
        report the snapshot in the background, once the one before is committed (its buffers are then free)."""
        if sharded is not None and self.process_group is None and is_distributed():
            raise ValueError("a sharded checkpoint is saved in the background on a process group of its own: none set")
        self.wait()
        copied, copied_sharded = snapshot((files, sharded), self._buffers)
        self._thread = threading.Thread(
            target=self._write_and_report,
            args=(copied, metrics, copied_sharded),
            name="checkpoint-writer",
            daemon=True,
        )
        self._thread.start()

    def wait(self) -> None:
        """Until the checkpoint in flight, if any, is committed; raises what writing or reporting it raised."""
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()
        error, self._error = self._error, None
        if error is not None:
            raise RuntimeError("an asynchronous checkpoint failed to write or commit") from error

    def _write_and_report(
        self, files: dict[str, Any], metrics: dict[str, Any], sharded: dict[str, Any] | None = None
    ) -> None:
        folder = tempfile.mkdtemp(prefix="checkpoint-")
        try:
            write_checkpoint_files(
                folder,
                files,
                rank=self.ctx.rank,
                world_size=self.ctx.world_size,
                sharded=sharded,
                process_group=self.process_group,
            )
            self.ctx.report(metrics, folder)
        except BaseException as error:  # raised on the loop at its next wait
            self._error = error
        finally:
            shutil.rmtree(folder, ignore_errors=True)
