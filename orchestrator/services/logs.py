"""A job's output (Ray forwards every worker's output into its driver's), read or followed: Ray's live
copy when Ray has it, else the durable one (``orchestrator.loops.log_archive``), without terminal escape
codes; what of it is shown (Ray's chatter, one rank) is ``orchestrator.services.log_lines``'s ``view``."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass

import anyio
from sqlalchemy.orm import Session, sessionmaker

from orchestrator.backend import BackendUnavailable, ClusterBackend
from orchestrator.db.models import Job, Sweep, utcnow
from orchestrator.errors import TooMany
from orchestrator.loops.log_archive import LogArchive
from orchestrator.services.log_lines import strip_ansi, view
from orchestrator.states.jobs import TERMINAL

# A driver reports the job's end, then shuts down (Ray Train's last lines, Ray's "[repeated Nx]" summary):
# a follow waits this long at most for its process to exit, so the stream ends with everything it printed.
DRIVER_EXIT_GRACE_S = 30.0


def read_logs(backend: ClusterBackend, archive: LogArchive, job: Job | Sweep, attempt: int | None = None) -> str:
    """The output of one attempt (default: the current one) of a job or a sweep's driver, without escape codes;
    empty before it has started."""
    attempt = job.attempt if attempt is None else attempt
    if not 1 <= attempt <= job.attempt:
        return ""
    try:
        live = backend.logs(f"{job.id}-{attempt}")
    except BackendUnavailable:
        live = None
    try:
        archived = archive.read(job.id, attempt)
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


@dataclass(frozen=True)
class _Snapshot:
    text: str
    finished: bool  # the job has ended and its driver prints nothing more


class TooManyFollows(TooMany):
    """429: the key already follows as many logs as it may."""

    retry_after_s = 5


class LogFollows:
    """Live follows of jobs' output, asynchronous: a follow holds no thread while it waits, only for the
    moment a read takes. However many follow one job, its output is read at most once per ``poll_s`` and
    each follower is sent only what is new. A key may hold ``max_per_key`` follows at once; a follow ends
    when its job does, after ``max_s``, or when the client goes away (the server cancels the stream)."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        backend: ClusterBackend,
        archive: LogArchive,
        max_per_key: int,
        poll_s: float = 1.0,
        max_s: float = 24 * 3600,
        keep_ray_chatter: bool = False,
    ):
        self.sessions, self.backend, self.archive = sessions, backend, archive
        self.keep_ray_chatter = keep_ray_chatter
        self.max_per_key, self.poll_s, self.max_s = max_per_key, poll_s, max_s
        self._lock = threading.Lock()
        self._by_key: Counter[str] = Counter()
        self._by_job: Counter[str] = Counter()
        self._latest: dict[str, tuple[float, _Snapshot | None]] = {}  # job id -> (when read, what)
        self._reading: dict[str, asyncio.Lock] = {}

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
            sent: int | None = None
            deadline = time.monotonic() + self.max_s
            while time.monotonic() < deadline:
                snapshot = await self._snapshot(job_id)
                if snapshot is None:
                    return
                # Whole lines only until the end: a line is judged (chatter? whose?) once it is complete.
                raw = snapshot.text if snapshot.finished else snapshot.text[: snapshot.text.rfind("\n") + 1]
                text = view(raw, self.keep_ray_chatter, rank)
                if sent is None:  # the first send: the last `tail` lines, or all of it
                    sent = len(text) - len(last_lines(text, tail))
                if len(text) < sent:
                    sent = 0  # a new attempt started a new log
                if len(text) > sent:
                    yield text[sent:]
                    sent = len(text)
                if snapshot.finished:
                    return
                await asyncio.sleep(self.poll_s)
        finally:
            self._release(job_id, key)

    async def _snapshot(self, job_id: str) -> _Snapshot | None:
        """The job's output, read again only when the last read is older than ``poll_s``: one read a
        poll for all its followers, in a worker thread (the backend and the database are blocking)."""
        lock = self._reading.setdefault(job_id, asyncio.Lock())
        async with lock:
            read_at, snapshot = self._latest.get(job_id, (0.0, None))
            if snapshot is None or time.monotonic() - read_at >= self.poll_s:
                snapshot = await anyio.to_thread.run_sync(self._read, job_id)
                self._latest[job_id] = (time.monotonic(), snapshot)
            return snapshot

    def _read(self, job_id: str) -> _Snapshot | None:
        with self.sessions() as session:
            job = session.get(Job, job_id)
            if job is None:
                return None
            finished = job.state in TERMINAL and _driver_exited(self.backend, job)
            return _Snapshot(read_logs(self.backend, self.archive, job), finished)

    def _release(self, job_id: str, key: str) -> None:
        with self._lock:
            self._by_key[key] -= 1
            self._by_job[job_id] -= 1
            if self._by_key[key] <= 0:
                del self._by_key[key]
            if self._by_job[job_id] <= 0:  # nobody follows it: forget what was read
                del self._by_job[job_id]
                self._latest.pop(job_id, None)
                self._reading.pop(job_id, None)


def _driver_exited(backend: ClusterBackend, job: Job) -> bool:
    """Whether the ended job's current attempt prints nothing more: its Ray job has finished (or Ray lost
    it), or the grace since the job ended has passed."""
    if job.attempt == 0 or job.finished_at is None:
        return True
    if (utcnow() - job.finished_at).total_seconds() > DRIVER_EXIT_GRACE_S:
        return True
    try:
        return backend.info(f"{job.id}-{job.attempt}").status.finished
    except BackendUnavailable:
        return True  # no live copy to wait for: the archive is what there is
