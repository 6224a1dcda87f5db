"""Checkpoint retention and the orphan sweeper: storage and the database list the same checkpoints.

Ray Train keeps every checkpoint it writes (``num_to_keep=None``); the control plane decides what goes:

- **Retention.** A job keeps its newest ``checkpoint.keep`` checkpoints (newest = most recently
  recorded, which is the order Ray Train registered them in) plus, with ``checkpoint.keep_best``, the
  best ``count`` by the metric (checkpoints without it don't count; ties: the newer). The latest is
  never deleted. The rule is ``orchestrator.checkpoint_policy``, which sweep trials share
  (``orchestrator.loops.trial_retention``).
  Whatever else is recorded is deleted from storage first, then from the database, so the database
  never forgets a folder that is still there; if a delete fails the row stays and it is tried again.
- **Sweeper.** ``checkpoint_*`` folders in a job's run folder that the database does not list (Ray
  Train wrote them but they were never recorded: a crash before registration, an incomplete save) are
  deleted once older than ``checkpoint_orphan_grace_s`` while the job runs (a late report may still
  record one), and at once when the job has ended. A recorded checkpoint whose folder is gone is
  forgotten (with a warning). Other files of the run folder are Ray's and are left alone.
- **Deployments.** A checkpoint that any version of a live (not DELETED) deployment references is
  never deleted, by retention or by the sweeper, whatever the policy says. Any version, not only the
  newest (what a rollout aims at) and the live one (what serves, and what a failed rollout falls back
  to): a rollback returns to the version before the newest, which changes with every PATCH, and every
  version stays in the deployment's history. A narrower rule would have to track the serving
  reconciler's choices exactly; this one costs at most one kept folder per version. Once the deployment
  is DELETED the next pass deletes what the policy drops, and the loop revisits such a job even when
  it ended long ago.

- **History.** With ``ORCHESTRATOR_HISTORY_DAYS`` set, the metric points of jobs that ended more than that
  many days ago are deleted (``HistoryRetention``), at most ``HISTORY_BATCH_JOBS`` jobs a transaction and
  ``HISTORY_BATCHES_PER_TICK`` transactions a tick, so a first pass over a year of history never holds a
  lock for long (on SQLite a write transaction locks the whole database). The job row stays with its
  summary (``latest_metrics``, ``result``), its events and its checkpoints. A job's points go together,
  when the job as a whole is that old: a curve is never cut in the middle.

Nothing here touches storage while a job row is locked (on SQLite a transaction locks the whole
database): rows are read in one short session, storage is changed with none open, and rows are deleted
in another short transaction. Retention runs right after the events endpoint records a checkpoint (after
its commit) and, with the sweeper, every ``checkpoint_sweep_interval_s`` in the background.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime, timedelta

from sqlalchemy import delete, exists, select
from sqlalchemy.orm import Session, sessionmaker

from orchestrator.checkpoint_policy import RecordedCheckpoint, select_kept
from orchestrator.db.models import Job, JobMetric, JobState, utcnow
from orchestrator.loops.trial_retention import TrialCheckpointJanitor
from orchestrator.repositories import deployments as deployments_repo
from orchestrator.repositories import jobs as jobs_repo
from orchestrator.repositories import sweeps as sweeps_repo
from orchestrator.settings import Settings
from orchestrator.states.jobs import TERMINAL
from orchestrator.storage import CheckpointStorage, RunStorages, StorageError
from orchestrator_contract.jobs import CheckpointSpec

log = logging.getLogger(__name__)

# A finished job's run folder is swept for this long after it ends: a stopped run's workers may still
# be finishing a save when the job is already CANCELLED.
RECHECK_FINISHED = timedelta(hours=1)


# History retention's bounds: jobs whose points one transaction deletes (200 points a job is 10,000 rows),
# and transactions a tick; what is left waits for the next tick.
HISTORY_BATCH_JOBS = 50
HISTORY_BATCHES_PER_TICK = 20


class HistoryRetention:
    """Deletes the metric points of jobs that ended more than ``settings.history_days`` ago (off when None)."""

    def __init__(self, sessions: sessionmaker[Session], settings: Settings):
        self.sessions = sessions
        self.settings = settings

    def tick(self, now: datetime | None = None) -> int:
        """One bounded pass; returns how many points went. ``now`` moves the clock (tests)."""
        if self.settings.history_days is None:
            return 0
        cutoff = (now or utcnow()) - timedelta(days=self.settings.history_days)
        deleted = 0
        for _ in range(HISTORY_BATCHES_PER_TICK):
            with self.sessions.begin() as session:
                job_ids = list(session.scalars(_ended_with_points(cutoff).limit(HISTORY_BATCH_JOBS)))
                if not job_ids:
                    break
                # created_at too: a point is never newer than its job's end, but the rule is "older than".
                gone = delete(JobMetric).where(JobMetric.job_id.in_(job_ids), JobMetric.created_at < cutoff)
                deleted += session.execute(gone).rowcount
            if len(job_ids) < HISTORY_BATCH_JOBS:
                break
        if deleted:
            log.info("history retention: deleted %d metric points of jobs that ended before %s", deleted, cutoff)
        return deleted


def _ended_with_points(cutoff: datetime):
    """Ids of jobs that ended before ``cutoff`` and still have metric points older than it, oldest end first
    (ix_jobs_finished_at; the points' unique (job_id, attempt, step) index answers the EXISTS)."""
    old_point = exists().where(JobMetric.job_id == Job.id, JobMetric.created_at < cutoff)
    return (
        select(Job.id)
        .where(Job.state.in_(TERMINAL), Job.finished_at < cutoff, old_point)
        .order_by(Job.finished_at, Job.id)
    )


class CheckpointJanitor:
    def __init__(self, sessions: sessionmaker[Session], storages: RunStorages | CheckpointStorage, settings: Settings):
        self.sessions = sessions
        # Each job's folder is on its cluster's storage (orchestrator.storage.RunStorages).
        self.storages = storages if isinstance(storages, RunStorages) else RunStorages(storages)
        self.settings = settings
        self._swept_everything = False
        self._warned: set[str] = set()
        # Jobs whose checkpoints live deployments referenced at the last tick (None before the first,
        # which visits every job anyway), and those no longer referenced and not yet revisited.
        self._served_jobs: set[str] | None = None
        self._released: set[str] = set()
        # The events endpoint and the loop may look at the same job at once; one at a time keeps the
        # sweeper from taking a folder retention is deleting for one that vanished on its own.
        self._busy = threading.RLock()
        # Sweep trials' checkpoints: the same rule, their own records.
        self.trials = TrialCheckpointJanitor(sessions, self.storages)
        self.history = HistoryRetention(sessions, settings)

    # --- the background loop ------------------------------------------------------------------------

    def tick(self) -> None:
        """Retention and sweeping for every active or recently finished job and sweep (every started one
        on the first tick, for those that ended while the service was down), and for every job whose
        checkpoints live deployments stopped referencing since the last tick; and history retention (the
        database only: it runs while storage is away too)."""
        self.history.tick()
        # A storage that isn't there (an unmounted volume) is left alone: a missing folder proves nothing then.
        available: dict[str, bool] = {}

        def reachable(cluster: str | None) -> bool:
            storage = self.storages.of(cluster)
            if storage.storage_path not in available:
                available[storage.storage_path] = storage.available()
            return available[storage.storage_path]

        since = None if not self._swept_everything else utcnow() - RECHECK_FINISHED
        with self.sessions() as session:
            jobs = jobs_repo.jobs_for_checkpoint_upkeep(session, since)
            jobs += self._released_jobs(session, {job_id for job_id, _, _ in jobs})
        for job_id, state, cluster in jobs:
            if not reachable(cluster):
                continue
            try:
                self.enforce_retention(job_id)
                self.sweep(job_id, finished=state in TERMINAL)
                self._released.discard(job_id)
            except StorageError as exc:
                log.warning("checkpoint upkeep of job %s: %s; trying again later", job_id, exc)
        with self.sessions() as session:
            sweeps = sweeps_repo.sweeps_for_checkpoint_upkeep(session, since)
        for sweep_id, state, cluster in sweeps:
            if not reachable(cluster):
                continue
            try:
                self.trials.upkeep(sweep_id, finished=state in TERMINAL)
            except StorageError as exc:
                log.warning("checkpoint upkeep of sweep %s: %s; trying again later", sweep_id, exc)
        self._swept_everything = True

    def _released_jobs(self, session: Session, listed: set[str]) -> list[tuple[str, JobState, str | None]]:
        """``(id, state, cluster)`` of the jobs not in ``listed`` whose checkpoints live deployments referenced
        and no longer do (a deployment was deleted): what retention kept for it may go now, however long
        ago the job ended."""
        served = deployments_repo.referenced_checkpoint_jobs(session)
        if self._served_jobs is not None:
            self._released |= self._served_jobs - served
        self._released -= served
        self._served_jobs = served
        released = []
        for job_id in sorted(self._released - listed):
            job = session.get(Job, job_id)
            if job is None:
                self._released.discard(job_id)
            else:
                released.append((job.id, job.state, job.cluster))
        return released

    def after_recording(self, job_id: str) -> None:
        """Right after the events endpoint committed a checkpoint: apply retention now. A failure is
        only logged (the events were taken); the loop applies it again."""
        try:
            self.enforce_retention(job_id)
        except Exception:
            log.exception("job %s: retention after a new checkpoint failed; the sweep loop will retry", job_id)

    # --- retention -------------------------------------------------------------------------------------

    def enforce_retention(self, job_id: str) -> list[str]:
        """Delete the job's checkpoints that retention does not keep: storage first, then the rows.
        Returns the recorded paths of those deleted."""
        with self._busy:
            return self._enforce_retention(job_id)

    def _enforce_retention(self, job_id: str) -> list[str]:
        with self.sessions() as session:
            job = session.get(Job, job_id)
            if job is None:
                return []
            policy = CheckpointSpec.model_validate(job.spec.get("checkpoint", {}))
            cluster = job.cluster
            recorded = _recorded(session, job_id)
            served = deployments_repo.referenced_checkpoint_paths(session)
        storage = self.storages.of(cluster)  # with no session open (the registry may read one)
        kept = select_kept(recorded, policy.keep, policy.keep_best)
        # What a live deployment references stays, whatever the policy says (see the module doc).
        served_names = self._served_names(storage, job_id, served)
        for c in recorded:
            if c.id not in kept and (c.path in served or storage.checkpoint_name(job_id, c.path) in served_names):
                kept.add(c.id)
                log.debug("job %s: checkpoint %s outlives retention: a live deployment references it", job_id, c.path)
        deleted = [c for c in recorded if c.id not in kept and self._delete_folder(storage, job_id, c.path)]
        if deleted:
            with self.sessions.begin() as session:
                jobs_repo.delete_checkpoints(session, job_id, [c.id for c in deleted])
            log.info("job %s: retention deleted checkpoint(s) %s", job_id, ", ".join(c.path for c in deleted))
        return [c.path for c in deleted]

    def _delete_folder(self, storage: CheckpointStorage, job_id: str, path: str) -> bool:
        """Delete a recorded checkpoint's folder; True when it is gone (or was never there)."""
        if storage.checkpoint_name(job_id, path) is not None:
            try:
                storage.delete_checkpoint(job_id, path)
                return True
            except StorageError as exc:
                log.warning("job %s: could not delete checkpoint %s (its record stays): %s", job_id, path, exc)
                return False
        # Not in the job's run folder on this storage (the storage setting changed, say): forget it if it
        # is gone, but never delete what lies outside the run folders this service owns.
        try:
            exists = storage.exists(path)
        except StorageError:
            exists = None
        if exists is False:
            return True
        if path not in self._warned:
            self._warned.add(path)
            log.warning(
                "job %s: checkpoint %s lies outside %s; retention leaves it (and its record) alone",
                job_id,
                path,
                storage.run_dir(job_id),
            )
        return False

    @staticmethod
    def _served_names(storage: CheckpointStorage, job_id: str, served: set[str]) -> set[str]:
        """The names of the job's checkpoint folders among the paths deployments reference (compared by
        folder, so a path recorded in another spelling still matches)."""
        return {name for path in served if (name := storage.checkpoint_name(job_id, path)) is not None}

    # --- the sweeper -------------------------------------------------------------------------------------

    def sweep(self, job_id: str, finished: bool) -> tuple[list[str], list[str]]:
        """Delete the job's orphaned checkpoint folders and forget records whose folder is gone.
        Returns (folders deleted, records forgotten), as recorded paths."""
        with self._busy:
            return self._sweep(job_id, finished)

    def _sweep(self, job_id: str, finished: bool) -> tuple[list[str], list[str]]:
        with self.sessions() as session:
            recorded = _recorded(session, job_id)
            cluster = session.scalar(select(Job.cluster).where(Job.id == job_id))
        storage = self.storages.of(cluster)
        # Listed after the rows were read: a row read here was recorded after its folder was written, so
        # a folder missing from this listing really is gone.
        stored = storage.list_checkpoints(job_id)
        by_name = {name: c for c in recorded if (name := storage.checkpoint_name(job_id, c.path))}

        gone = [c for name, c in by_name.items() if name not in stored]
        if gone:
            with self.sessions.begin() as session:
                jobs_repo.delete_checkpoints(session, job_id, [c.id for c in gone])
            for c in gone:
                log.warning("job %s: checkpoint %s is gone from storage; forgot it", job_id, c.path)

        grace_ns = int(self.settings.checkpoint_orphan_grace_s * 1e9)
        now_ns = time.time_ns()
        orphans = []
        for name, folder in stored.items():
            if name in by_name:
                continue
            if not finished:
                changed = storage.last_modified_ns(folder.path)
                if changed is None or now_ns - changed < grace_ns:
                    continue  # young (or of unknown age): a late report may still record it
            orphans.append(folder)
        deleted = []
        if orphans:
            with self.sessions() as session:  # again, just before deleting: one may have been recorded since
                names_now = {storage.checkpoint_name(job_id, c.path) for c in _recorded(session, job_id)}
                # An unrecorded folder a live deployment loads (its record was forgotten) is no orphan.
                served_names = self._served_names(
                    storage, job_id, deployments_repo.referenced_checkpoint_paths(session)
                )
            for folder in orphans:
                if folder.name in names_now or folder.name in served_names:
                    continue
                storage.delete_checkpoint(job_id, folder.path)
                deleted.append(folder.path)
                log.info("job %s: deleted checkpoint folder %s, which was never recorded", job_id, folder.path)
        return deleted, [c.path for c in gone]


def _recorded(session: Session, job_id: str) -> list[RecordedCheckpoint]:
    return [
        RecordedCheckpoint(c.id, c.path, c.step, dict(c.metrics or {}))
        for c in jobs_repo.list_checkpoints(session, job_id)
    ]
