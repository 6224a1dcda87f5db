"""A job's output (Ray forwards every worker's output into its driver's), read or followed: Ray's live
copy when Ray has it, else the durable one (``orchestrator.services.log_archive``)."""

from __future__ import annotations

import time
from collections.abc import Iterator

from sqlalchemy.orm import Session, sessionmaker

from orchestrator.backend import BackendUnavailable, ClusterBackend
from orchestrator.db.models import Job, Sweep, utcnow
from orchestrator.services.log_archive import LogArchive
from orchestrator.states import TERMINAL

# A driver reports the job's end, then shuts down (Ray Train's last lines, Ray's "[repeated Nx]" summary):
# a follow waits this long at most for its process to exit, so the stream ends with everything it printed.
DRIVER_EXIT_GRACE_S = 30.0


def read_logs(backend: ClusterBackend, archive: LogArchive, job: Job | Sweep, attempt: int | None = None) -> str:
    """The output of one attempt (default: the current one) of a job or a sweep's driver; empty before it
    has started."""
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
    candidates = [text for text in (live, archived) if text]
    return max(candidates, key=len, default="")


def follow_logs(
    sessions: sessionmaker[Session],
    backend: ClusterBackend,
    archive: LogArchive,
    job_id: str,
    poll_s: float = 1.0,
    max_s: float = 24 * 3600,
) -> Iterator[str]:
    """Yields new output as it appears, until the job ends (and its last output is sent)."""
    sent = 0
    deadline = time.monotonic() + max_s
    while time.monotonic() < deadline:
        with sessions() as session:
            job = session.get(Job, job_id)
            if job is None:
                return
            finished = job.state in TERMINAL and _driver_exited(backend, job)
            text = read_logs(backend, archive, job)
        if len(text) < sent:
            sent = 0  # a new attempt started a new log
        if len(text) > sent:
            yield text[sent:]
            sent = len(text)
        if finished:
            return
        time.sleep(poll_s)


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
