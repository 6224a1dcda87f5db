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
