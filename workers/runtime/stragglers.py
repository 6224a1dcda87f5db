"""Each rank's own time per step, for the control plane's straggler detection (docs/jobs.md "Stragglers").

A rank's own time is what it spends on its own: waiting for its data and its forward pass. Its backward pass is
left out: there DDP all-reduces the gradients, and every rank waits for the slowest, so every rank's step takes
as long. The window's times travel in the metric window's one all-reduce (each rank fills its own slot), and rank
0 sends them with its metrics: no message per rank, no collective of their own.

On CUDA the forward pass is timed with events on the stream (read once per window, when the window's sums are
read anyway); on the CPU with the clock.
"""

from __future__ import annotations

import time

import torch


class OwnTime:
    """Seconds of this rank's own work in the current window."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.host_s = 0.0  # data waits, and forward passes on the CPU
        self._events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self._started = 0.0

    def add(self, seconds: float) -> None:
        """Host time of its own (waiting for a batch)."""
        self.host_s += seconds

    def forward_begin(self) -> None:
        if self.cuda:
            start = torch.cuda.Event(enable_timing=True)
            start.record()
            self._events.append((start, torch.cuda.Event(enable_timing=True)))
        else:
            self._started = time.perf_counter()

    def forward_end(self) -> None:
        if self.cuda:
            self._events[-1][1].record()
        else:
            self.host_s += time.perf_counter() - self._started

    def take(self) -> float:
        """The window's seconds, and a new window."""
        seconds = self.host_s
        if self._events:
            self._events[-1][1].synchronize()
            seconds += sum(start.elapsed_time(end) for start, end in self._events) / 1000.0
        self.host_s, self._events = 0.0, []
        return seconds


STORE_KEY = "orchestrator/own_time/{rank}"  # in the process group's store: "<own seconds> <steps>", cumulative
PUBLISH_EVERY_S = 1.0  # a rank writes its sums to the store at most this often: no message per step


class FunctionOwnTime:
    """Each rank's own time in a training function (``main(ctx)``), with no code of the user's: the forward passes
    of the model ``ctx.prepare`` wrapped (training ones: ``model.training``) and the waits for ``ctx.shard``'s
    batches, one step per training forward.

    A function's reports are rank 0's alone (other ranks may call ``report`` or not), so the times cannot ride a
    collective as the built-in loop's do: every rank writes its running sums into the process group's key-value
    store (at most once a second, a write of a few bytes, never a wait), and rank 0 reads them at each report and
    sends each rank's seconds per step since its previous report (``MetricsEvent.rank_step_s``).
    """

    def __init__(self, device: torch.device, rank: int, world_size: int, store=None) -> None:
        self.rank, self.world_size = rank, world_size
        self.own = OwnTime(device)
        self.total_s, self.steps = 0.0, 0
        self.store = store if store is not None else _default_store(world_size)
        self._published = 0.0
        self._last_read: dict[int, tuple[float, int]] = {}

    @property
    def enabled(self) -> bool:
        return self.store is not None

    def attach(self, model: torch.nn.Module) -> None:
        """Times ``model``'s training forward passes from now on."""
        if self.enabled:
            model.register_forward_pre_hook(self._forward_begin)
            model.register_forward_hook(self._forward_end)

    def batches(self, iterator):
        """``iterator``'s batches, the wait for each counted as this rank's own time."""
        while True:
            started = time.perf_counter()
            try:
                batch = next(iterator)
            except StopIteration:
                return
            self.own.add(time.perf_counter() - started)
            yield batch

    def _forward_begin(self, module: torch.nn.Module, args) -> None:
        if module.training:
            self.own.forward_begin()

    def _forward_end(self, module: torch.nn.Module, args, output) -> None:
        if not module.training:
            return
        self.own.forward_end()
        self.steps += 1
        now = time.monotonic()
        if now - self._published >= PUBLISH_EVERY_S:
            self.publish(now)

    def publish(self, now: float | None = None) -> None:
        self.total_s += self.own.take()
        self._published = time.monotonic() if now is None else now
        self.store.set(STORE_KEY.format(rank=self.rank), f"{self.total_s} {self.steps}")

    def gather(self) -> list[float] | None:
        """Rank 0, at a report: each rank's own seconds per step since the previous gather, by rank; None until
        every rank has stepped since then (a rank that has not published yet, or the first report)."""
        if not self.enabled or self.world_size < 2:
            return None
        self.publish()
        keys = [STORE_KEY.format(rank=rank) for rank in range(self.world_size)]
        if not self.store.check(keys):
            return None
        per_step, current = [], {}
        for rank, key in enumerate(keys):
            own_s, steps = self.store.get(key).decode().split()
            current[rank] = (float(own_s), int(steps))
            last_s, last_steps = self._last_read.get(rank, (0.0, 0))
            if current[rank][1] <= last_steps:
                return None  # the window goes on until every rank has published steps of it
            per_step.append(max(current[rank][0] - last_s, 0.0) / (current[rank][1] - last_steps))
        self._last_read = current
        return per_step


def _default_store(world_size: int):
    """The default process group's store (Ray Train's and ``LocalContext``'s ``init_process_group`` make one);
    None with one rank or none."""
    import torch.distributed as dist

    if world_size < 2 or not dist.is_available() or not dist.is_initialized():
        return None
    try:
        return dist.distributed_c10d._get_default_store()
    except (AttributeError, RuntimeError, ValueError):  # a private function: no straggler times rather than a crash
        return None
