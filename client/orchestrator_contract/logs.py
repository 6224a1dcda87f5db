"""The one line each training worker prints when it starts, naming its rank: how a job's log tells ranks apart.

Ray forwards a worker's output into its driver's with a prefix naming the process, not the rank:
``(RayTrainWorker pid=9728)`` on the driver's node, ``(RayTrainWorker pid=9728, ip=10.0.0.3)`` on another.
So every worker prints ``rank_marker(...)`` first, and whoever reads the log (the control plane's
``?rank=`` filter, ``orchestrator.services.log_lines``) maps that prefix's process to the rank from then on.
A restarted worker group prints new markers (new processes), so the mapping follows it.

Ray's log deduplication takes lines that differ only in their numbers for one line (it drops every word with a
digit), so it would hold back every marker but the first for seconds, until after the worker's next lines:
drivers run with ``RAY_DEDUP_LOGS_ALLOW_REGEX=DEDUP_ALLOW`` so the markers pass at once.
"""

from __future__ import annotations

import re

# "[rank 0/2] training worker started (pid 9728, host node-a)"
RANK_MARKER = re.compile(r"\[rank (?P<rank>\d+)/(?P<world_size>\d+)\] training worker started \(pid (?P<pid>\d+)")

# And every line of a rank's stacks (hang detection, ``workers.runtime.stacks``): many are alike within a rank and
# across ranks, and each must reach the log.
DEDUP_ALLOW = r"\[rank \d+/\d+\] training worker started \(pid \d+|\[rank \d+ stacks\] "


def rank_marker(rank: int, world_size: int, pid: int, host: str) -> str:
    return f"[rank {rank}/{world_size}] training worker started (pid {pid}, host {host})"


def stacks_line_prefix(rank: int) -> str:
    """What starts each line of rank ``rank``'s stacks in the attempt's log."""
    return f"[rank {rank} stacks] "
