"""What a job's log shows of its raw output: terminal colour codes removed, Ray Train's per-report and
per-checkpoint chatter quieted (unless ORCHESTRATOR_LOG_RAY_CHATTER), and optionally one rank's lines only.

Ray forwards each worker's lines into the driver's output behind a prefix naming the process, e.g.
``(RayTrainWorker pid=9728)`` (``, ip=10.0.0.3`` on another node). Which rank a process is comes from the
line every training worker prints first (``orchestrator_contract.logs``), or, for logs of runs from before it,
from Ray Train's own lines: a worker's ``Setting up process group for: env:// [rank=0, world_size=2]`` and
the controller's list of a new worker group (``- (ip=..., pid=9728) world_rank=0, ...``). A line whose process
has no known rank (the driver's, Ray's) belongs to no rank. Every line of the user's, of our training
loop's and every error and traceback stays: only the lines ``CHATTER`` matches go.

Each line is judged on what came before it only, so the view of the first part of a log is the first part
of the view of the whole: a follow can send what is new of the view as the log grows.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import NamedTuple

from orchestrator_contract.logs import RANK_MARKER

# CSI sequences (colours, cursor moves: ESC [ ... final byte) and the two-byte escapes.
ANSI_ESCAPE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")
# "(RayTrainWorker pid=9728) " or "(RayTrainWorker pid=9728, ip=10.0.0.3) " at the start of a line.
RAY_PREFIX = re.compile(r"\((?P<actor>[\w.:-]+) pid=(?P<pid>\d+)(?:, ip=(?P<ip>[^)\s]+))?\) ")
# Ray Train's controller naming a new worker group's ranks: "- (ip=10.0.0.3, pid=9728) world_rank=0, ...".
RAY_TRAIN_GROUP_MEMBER = re.compile(r"- \(ip=(?P<ip>[^,\s]+), pid=(?P<pid>\d+)\) world_rank=(?P<rank>\d+)")
# A Ray Train worker's own first line: "Setting up process group for: env:// [rank=0, world_size=2]".
RAY_TRAIN_PROCESS_GROUP = re.compile(r"Setting up process group for: \S+ \[rank=(?P<rank>\d+), world_size=\d+\]")
# Ray Train's lines per report and per checkpoint (every epoch, on every worker).
CHATTER = re.compile(r"(Checkpoint successfully created at: |Reporting training result \d+: )")
# The hint Ray adds to a deduplicated line; the "[repeated Nx across cluster]" itself stays.
DEDUP_HINT = re.compile(r" ?\(Ray deduplicates logs by default\.[^)]*\)")


def strip_ansi(text: str) -> str:
    return ANSI_ESCAPE.sub("", text)


def view(text: str, keep_ray_chatter: bool = False, rank: int | None = None) -> str:
    """``text`` (a raw log, escape codes or not) as served: see the module's docstring."""
    return "".join(view_lines(strip_ansi(text).splitlines(keepends=True), keep_ray_chatter, rank))


def view_lines(lines: Iterable[str], keep_ray_chatter: bool, rank: int | None) -> Iterable[str]:
    viewer = LineViewer(keep_ray_chatter)
    for line in lines:
        shown = viewer.judge(line)
        if shown.text is not None and (rank is None or shown.rank == rank):
            yield shown.text


class Shown(NamedTuple):
    rank: int | None  # the rank of the process that printed the line, as known then; None: no rank's
    text: str | None  # the line as served; None: Ray's chatter, left out


class LineViewer:
    """``view`` one line at a time, in order: a log read in pieces is judged as the whole would be, so a
    follow judges each new line once (and any rank's follower of it filters on ``Shown.rank``)."""

    def __init__(self, keep_ray_chatter: bool = False):
        self.keep_ray_chatter = keep_ray_chatter
        self.ranks: dict[tuple[str, str | None], int] = {}  # (pid, ip as the prefix gives it) -> rank

    def judge(self, line: str) -> Shown:
        """``line`` (one line, escape codes removed) as served, and whose it is."""
        prefix = RAY_PREFIX.match(line)
        body = line[prefix.end() :] if prefix else line
        process = (prefix["pid"], prefix["ip"]) if prefix else None
        _learn_ranks(body, process, self.ranks)
        rank = self.ranks.get(process) if process is not None else None
        if not self.keep_ray_chatter:
            if CHATTER.match(body):
                return Shown(rank, None)
            line = DEDUP_HINT.sub("", line)
        return Shown(rank, line)


def _learn_ranks(body: str, process: tuple[str, str | None] | None, ranks: dict) -> None:
    marker = RANK_MARKER.match(body)
    if marker and process is not None and marker["pid"] == process[0]:
        ranks[process] = int(marker["rank"])
        return
    own = RAY_TRAIN_PROCESS_GROUP.match(body)
    if own and process is not None:
        ranks[process] = int(own["rank"])
        return
    member = RAY_TRAIN_GROUP_MEMBER.match(body)
    if member:
        # The worker's own lines name its ip only when it is on another node than the driver: learn both.
        for ip in (member["ip"], None):
            ranks[(member["pid"], ip)] = int(member["rank"])
