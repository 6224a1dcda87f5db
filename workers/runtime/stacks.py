"""A rank's Python stacks, for the control plane's hang detection (docs/jobs.md "Hangs").

Taken from inside the process by a daemon thread (``workers.runtime.control``), as ``faulthandler`` would print
them but as text we can send: every thread's frames from ``sys._current_frames``. The training thread (Ray
Train V2 runs the training function in a thread of its worker actor, not the main one) is the one the poller was
made on; where it was decides the rank's place. A thread blocked in a collective
(gloo, NCCL), in ``time.sleep`` or in I/O has released the GIL, so this works for every hang but a C extension
that holds the GIL (that rank then gives no answer, and the control plane says so).
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import traceback
from types import FrameType

# A training thread whose innermost frames are in any of these is waiting for the other ranks: a collective,
# DDP's all-reduce inside a backward pass (autograd runs it), Ray Train's report (a barrier).
COLLECTIVE_PATHS = ("torch/distributed/", "torch/autograd/", "torch/nn/parallel/distributed.py", "ray/train/")
_STDLIB = os.path.dirname(threading.__file__)


def all_stacks(training: int) -> str:
    """Every thread's stack, the training thread (``training``, its ident) first, innermost frame last."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    frames = sys._current_frames()
    order = sorted(frames, key=lambda ident: (ident != training, names.get(ident, "")))
    parts = []
    for ident in order:
        stack = "".join(traceback.format_stack(frames[ident]))
        parts.append(f'Thread "{names.get(ident, ident)}"{" (training)" if ident == training else ""}:\n{stack}')
    return "\n".join(parts)


def training_thread_place(training: int) -> tuple[bool, str]:
    """``(in_collective, where)`` of the training thread: ``where`` is its innermost frame of code of its own (not a
    library's: the user's line, or the loop's, that called into them), and it is in a collective when the library
    frames inside that one are a collective's (torch.distributed, a backward pass, Ray Train's report)."""
    frame: FrameType | None = sys._current_frames().get(training)
    return place(traceback.extract_stack(frame) if frame is not None else [])


def place(stack: list[traceback.FrameSummary]) -> tuple[bool, str]:
    """``training_thread_place`` of a stack (outermost frame first)."""
    summary = list(stack)
    inner: list[traceback.FrameSummary] = []
    while summary and _is_library(summary[-1].filename):
        inner.append(summary.pop())
    in_collective = any(_in(entry.filename, COLLECTIVE_PATHS) for entry in inner)
    innermost = summary[-1] if summary else (inner[0] if inner else None)
    if innermost is None:
        return in_collective, ""
    where = f"{os.path.basename(innermost.filename)}:{innermost.lineno} in {innermost.name}"
    if innermost.line:
        where += f": {innermost.line.strip()}"
    return in_collective, where[:500]


def _is_library(filename: str) -> bool:
    """An installed package's file or the standard library's, not the run's own code."""
    return "site-packages" in filename or filename.startswith(_STDLIB) or filename.startswith("<")


def _in(filename: str, paths: tuple[str, ...]) -> bool:
    return any(path in filename.replace(os.sep, "/") for path in paths)


def answer(request: str, rank: int, training: int) -> dict:
    """This rank's ``StacksEvent`` (as a dict) for the request ``request``; ``training``: the training thread's
    ident."""
    in_collective, where = training_thread_place(training)
    return {
        "type": "stacks",
        "request": request,
        "rank": rank,
        "node": socket.gethostname(),  # a pod's name on Kubernetes
        "pid": os.getpid(),
        "in_collective": in_collective,
        "where": where,
        "stacks": all_stacks(training)[-64_000:],
    }
