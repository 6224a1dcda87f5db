"""A job's output (Ray forwards every worker's output into its driver's), read or followed: Ray's live
copy when Ray has it, else the durable one (``orchestrator.loops.log_archive``), without terminal escape
codes; what of it is shown (Ray's chatter, one rank) is ``orchestrator.services.log_lines``'s ``view``. A
follow reads each byte once (``orchestrator.services.followed_log``)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator
from datetime import datetime

import anyio
from sqlalchemy.orm import Session, sessionmaker

from orchestrator.backend import BackendUnavailable, ClusterBackend
from orchestrator.backend.registry import ClusterBackends, backends_of
from orchestrator.db.models import Job, Sweep, utcnow
from orchestrator.errors import TooMany
from orchestrator.loops.log_archive import LogArchive
from orchestrator.services.followed_log import FollowedLog
from orchestrator.services.log_lines import strip_ansi
from orchestrator.states.jobs import TERMINAL

# A driver reports the job's end, then shuts down (Ray Train's last lines, Ray's "[repeated Nx]" summary):
# a follow waits this long at most for its process to exit, so the stream ends with everything it printed.
DRIVER_EXIT_GRACE_S = 30.0


def read_logs(backends: ClusterBackends, archive: LogArchive, job: Job | Sweep, attempt: int | None = None) -> str:
    """The output of one attempt (default: the current one) of a job or a sweep's driver, without escape codes;
    empty before it has started."""
    attempt = job.attempt if attempt is None else attempt
    if not 1 <= attempt <= job.attempt:
        return ""
    try:
        live = backends.of(job).logs(f"{job.id}-{attempt}")
    except BackendUnavailable:
        live = None
    try:
        archived = archive.read(job.id, attempt, job.cluster)
    except OSError:
        archived = None
    # Ray's copy is newer while the attempt runs; the archive is all there is once Ray lost it, and may
    # hold more than a resubmission of the same attempt on a new head.
    candidates = [strip_ansi(text) for text in (live, archived) if text]  # the archive's is already plain
    return max(candidates, key=len, default="")


def last_lines(text: str, tail: int | None) -> str:
    """The last ``tail`` lines of ``text`` (all of it when ``tail`` is None)."""
    if tail is None:
        return text
    lines = text.splitlines(keepends=True)
    return "".join(lines[-tail:]) if tail else ""


class TooManyFollows(TooMany):
    """429: the key already follows as many logs as it may."""

    retry_after_s = 5


class LogFollows:
    """Live follows of jobs' output, asynchronous: a follow holds no thread while it waits. However many follow
    one job, its output is read once for all of them (``FollowedLog``: Ray's log tail, each byte once, or the
    archived copy from where the last read stopped), its row looked at once per ``poll_s``, and each follower
    sends only its view of the lines it has not sent. A key may hold ``max_per_key`` follows at once; a follow
    ends when its job does (after its driver's last lines), after ``max_s``, or when the client goes away (the
    server cancels the stream)."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        backends: ClusterBackends | ClusterBackend,
        archive: LogArchive,
        max_per_key: int,
        poll_s: float = 1.0,
        max_s: float = 24 * 3600,
        keep_ray_chatter: bool = False,
    ):
        self.sessions, self.archive = sessions, archive
        self.backends = backends_of(backends, sessions)
        self.keep_ray_chatter = keep_ray_chatter
        self.max_per_key, self.poll_s, self.max_s = max_per_key, poll_s, max_s
        self._lock = threading.Lock()
        self._by_key: Counter[str] = Counter()
        self._by_job: Counter[str] = Counter()
        self._logs: dict[str, FollowedLog] = {}  # job id -> its output as its followers share it

    def active(self, key: str) -> int:
        with self._lock:
            return self._by_key[key]

    def start(self, job_id: str, key: str, tail: int | None = None, rank: int | None = None) -> AsyncIterator[str]:
        """Claim a follow for ``key`` now (TooManyFollows past the cap) and return its stream: the log's
        ``view`` (``rank``'s lines only, when given), whole lines as they come."""
        with self._lock:
            if self._by_key[key] >= self.max_per_key:
                raise TooManyFollows(
                    f"this key already follows {self._by_key[key]} logs, the most it may "
                    f"(ORCHESTRATOR_MAX_LOG_FOLLOWS_PER_KEY={self.max_per_key}): end one first"
                )
            self._by_key[key] += 1
            self._by_job[job_id] += 1
        return self._stream(job_id, key, tail, rank)

    async def _stream(self, job_id: str, key: str, tail: int | None, rank: int | None) -> AsyncIterator[str]:
        try:
            with self._lock:
                log = self._logs.get(job_id)
                if log is None:
                    log = self._logs[job_id] = FollowedLog(job_id, self.backends, self.archive, self.keep_ray_chatter)
            generation, position = None, 0
            deadline = time.monotonic() + self.max_s
            while time.monotonic() < deadline:
                await self._poll(log)
                if log.gone:
                    return
                if generation != log.generation:
                    if generation is None:  # the first send: the last `tail` lines of what was printed by now
                        if not (log.caught_up or log.finished):
                            await asyncio.sleep(self.poll_s)
                            continue
                        position = log.start_of_tail(rank, tail)
                    else:
                        position = 0  # a new attempt started a new log: all of it
                    generation = log.generation
                finished = log.finished  # as of the lines taken now: it may finish while this waits to send them
                text = log.since(position, rank)
                position = len(log.entries)
                if text:
                    yield text
                if finished:
                    return
                await asyncio.sleep(self.poll_s)
        finally:
            self._release(job_id, key)

    async def _poll(self, log: FollowedLog) -> None:
        """Look at the job's row, at most once per ``poll_s`` for all its followers (in a worker thread: the
        database is blocking), and bring the log's reads in line with it."""
        async with log.lock:
            if log.gone or log.finished or time.monotonic() - log.checked_at < self.poll_s:
                return
            row = await anyio.to_thread.run_sync(self._job_row, log.job_id)
            log.checked_at = time.monotonic()
            if row is None:
                log.gone = True
                log.close()
                return
            attempt, ended, finished_at, log.cluster = row
            grace_passed = finished_at is None or (utcnow() - finished_at).total_seconds() > DRIVER_EXIT_GRACE_S
            await log.update(attempt, ended, ended and grace_passed)

    def _job_row(self, job_id: str) -> tuple[int, bool, datetime | None, str | None] | None:
        with self.sessions() as session:
            job = session.get(Job, job_id)
            return None if job is None else (job.attempt, job.state in TERMINAL, job.finished_at, job.cluster)

    def _release(self, job_id: str, key: str) -> None:
        with self._lock:
            self._by_key[key] -= 1
            self._by_job[job_id] -= 1
            if self._by_key[key] <= 0:
                del self._by_key[key]
            if self._by_job[job_id] <= 0:  # nobody follows it: stop reading it and forget what was read
                del self._by_job[job_id]
                log = self._logs.pop(job_id, None)
                if log is not None:
                    log.close()
