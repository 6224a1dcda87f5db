"""Durable job logs: each attempt's driver output (Ray forwards every worker's output into it) is copied
into the run's storage while it runs, so it outlives the Ray cluster, whose job store dies with it.

    <storage>/<job id>/logs/attempt-<N>.log      (<storage>: the run's cluster's, orchestrator.storage.RunStorages)

A background loop copies the output of every attempt of each active job, and of jobs that ended
lately, when it has grown; an attempt that Ray reports finished and that is fully copied is not read
again. The API serves Ray's live output when Ray has it and the copy otherwise; a follow reads the copy
from the byte where its last read stopped (``read_from``).
"""

from __future__ import annotations

import logging
from datetime import timedelta

import pyarrow.fs
from sqlalchemy import or_, select
from sqlalchemy.orm import Session, sessionmaker

from orchestrator.backend import BackendUnavailable, ClusterBackend
from orchestrator.backend.registry import ClusterBackends, backends_of
from orchestrator.db.models import Job, Sweep, utcnow
from orchestrator.services.log_lines import strip_ansi
from orchestrator.states.jobs import ACTIVE
from orchestrator.storage import CheckpointStorage, RunStorages

log = logging.getLogger(__name__)

# Jobs that ended this recently still get a last copy (the reconciler may end a job between two ticks).
ENDED_RECENTLY = timedelta(minutes=5)


class LogArchive:
    """Each run's archived logs, in its run folder on its cluster's storage (``cluster`` None: the default
    cluster's, as for a run placed before clusters existed)."""

    def __init__(self, storages: RunStorages | CheckpointStorage):
        self.storages = storages if isinstance(storages, RunStorages) else RunStorages(storages)

    def path(self, job_id: str, attempt: int, cluster: str | None = None) -> str:
        return f"{self.storages.of(cluster).run_dir(job_id)}/logs/attempt-{attempt:04d}.log"

    def write(self, job_id: str, attempt: int, text: str, cluster: str | None = None) -> None:
        fs, path = self.storages.of(cluster).fs, self.path(job_id, attempt, cluster)
        fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
        temporary = f"{path}.partial"
        with fs.open_output_stream(temporary) as out:
            out.write(text.encode())
        fs.move(temporary, path)  # readers see the old copy or the new one, never half

    def read(self, job_id: str, attempt: int, cluster: str | None = None) -> str | None:
        try:
            with self.storages.of(cluster).fs.open_input_stream(self.path(job_id, attempt, cluster)) as stream:
                return stream.read().decode(errors="replace")
        except FileNotFoundError:
            return None

    def read_from(self, job_id: str, attempt: int, offset: int, cluster: str | None = None) -> bytes | None:
        """The copy's bytes from ``offset`` on (a follow reads only what it has not read); None: no copy."""
        try:
            with self.storages.of(cluster).fs.open_input_file(self.path(job_id, attempt, cluster)) as source:
                size = source.size()
                return source.read_at(size - offset, offset) if size > offset else b""
        except FileNotFoundError:
            return None

    def attempts(self, job_id: str, cluster: str | None = None) -> list[int]:
        storage = self.storages.of(cluster)
        selector = pyarrow.fs.FileSelector(f"{storage.run_dir(job_id)}/logs", allow_not_found=True)
        names = [info.base_name for info in storage.fs.get_file_info(selector)]
        return sorted(int(name[8:12]) for name in names if name.startswith("attempt-") and name.endswith(".log"))


class LogArchiver:
    """The loop's tick: copy what Ray has of each recent attempt into the archive."""

    def __init__(
        self, sessions: sessionmaker[Session], backends: ClusterBackends | ClusterBackend, archive: LogArchive
    ):
        self.sessions = sessions
        self.backends = backends_of(backends, sessions)
        self.archive = archive
        self._copied: dict[str, int] = {}  # submission id -> characters copied
        self._final: set[str] = set()  # submissions that ended and are fully copied

    def tick(self) -> None:
        with self.sessions() as session:
            recent = utcnow() - ENDED_RECENTLY
            jobs = [  # and sweeps: their drivers' output is archived the same way
                row
                for model in (Job, Sweep)
                for row in session.execute(
                    select(model.id, model.attempt, model.cluster).where(
                        model.attempt > 0, or_(model.state.in_(ACTIVE), model.finished_at >= recent)
                    )
                ).all()
            ]
        unreachable: set[str | None] = set()
        for job_id, current, cluster in jobs:
            for attempt in range(1, current + 1):
                if cluster in unreachable:
                    break
                try:
                    self.copy(job_id, attempt, cluster)
                except BackendUnavailable as exc:
                    log.warning("log archive: cluster %s unreachable, will retry: %s", cluster or "default", exc)
                    unreachable.add(cluster)
                except OSError as exc:
                    log.warning("log archive: cannot write the logs of job %s attempt %d: %s", job_id, attempt, exc)

    def copy(self, job_id: str, attempt: int, cluster: str | None = None) -> None:
        submission_id = f"{job_id}-{attempt}"
        if submission_id in self._final:
            return
        backend = self.backends.get(cluster)  # every attempt of a run is on the cluster it was placed on
        finished = backend.info(submission_id).status.finished  # asked first: no output after it
        text = backend.logs(submission_id)
        if text is None:  # Ray has none (never started, or the cluster was replaced): keep our copy
            if finished:
                self._final.add(submission_id)
            return
        if len(text) != self._copied.get(submission_id):
            self.archive.write(
                job_id, attempt, strip_ansi(text), cluster
            )  # stored plain; Ray's chatter kept (see log_lines)
            self._copied[submission_id] = len(text)
        if finished:
            self._final.add(submission_id)
