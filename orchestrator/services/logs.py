"""A job's driver output (Ray forwards every worker's output into it), read or followed."""

from __future__ import annotations

import time
from collections.abc import Iterator

from sqlalchemy.orm import Session, sessionmaker

from orchestrator.backend import BackendUnavailable, ClusterBackend
from orchestrator.db.models import Job
from orchestrator.states import TERMINAL


def read_logs(backend: ClusterBackend, job: Job) -> str:
    if job.attempt == 0:
        return ""
    try:
        return backend.logs(job.submission_id) or ""
    except BackendUnavailable:
        return ""


def follow_logs(
    sessions: sessionmaker[Session], backend: ClusterBackend, job_id: str, poll_s: float = 1.0, max_s: float = 24 * 3600
) -> Iterator[str]:
    """Yields new output as it appears, until the job ends (and its last output is sent)."""
    sent = 0
    deadline = time.monotonic() + max_s
    while time.monotonic() < deadline:
        with sessions() as session:
            job = session.get(Job, job_id)
            if job is None:
                return
            finished = job.state in TERMINAL
            text = read_logs(backend, job)
        if len(text) < sent:
            sent = 0  # a new attempt started a new log
        if len(text) > sent:
            yield text[sent:]
            sent = len(text)
        if finished:
            return
        time.sleep(poll_s)
