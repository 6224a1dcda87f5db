"""Retention and the orphan sweeper for sweep trials: what the database says a trial has, storage holds.

A trial trains as one Ray Train run (``<storage>/<sweep>/trials/<tune id>``; a PBT trial cloned from
another starts a new one, ``<tune id>-<n>``), and Ray Train keeps every checkpoint, as for a job. Each
epoch's checkpoint reaches the control plane with the epoch's metrics (``trial_metrics.checkpoint_path``),
and the control plane deletes what the trial does not keep, by the rule jobs use
(``orchestrator.checkpoint_policy.trial_retention``: the latest plus the best ``base.checkpoint.keep`` by
the sweep's metric, ties to the later epoch). The folder goes first, then the record, and the trial's
best checkpoint is chosen again among what is left: a trial never names a folder that is gone.

The sweeper forgets recorded checkpoints whose folder is gone, and deletes ``checkpoint_*`` folders no
epoch records (a save cut short, an epoch a stopped trial never reported) once the sweep has ended. A
checkpoint that a live deployment references is never deleted. As in ``retention``, storage is never
touched with a row locked.
"""

from __future__ import annotations

import logging
import posixpath
import threading

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from orchestrator.checkpoint_policy import RecordedCheckpoint, select_kept, trial_retention
from orchestrator.db.models import Sweep, Trial
from orchestrator.repositories import deployments as deployments_repo
from orchestrator.repositories import sweeps as sweeps_repo
from orchestrator.services.sweep_events import refresh_trial_best, update_best_trial
from orchestrator.states.sweeps import lock_sweep
from orchestrator.storage import CheckpointStorage, RunStorages, StorageError
from orchestrator_contract.sweeps import SweepSpec, trials_folder

log = logging.getLogger(__name__)


class TrialCheckpointJanitor:
    def __init__(self, sessions: sessionmaker[Session], storages: RunStorages | CheckpointStorage):
        self.sessions = sessions
        self.storages = storages if isinstance(storages, RunStorages) else RunStorages(storages)
        self._busy = threading.RLock()  # the events endpoint and the loop may look at one sweep at once

    def _storage(self, sweep_id: str) -> CheckpointStorage:
        """The storage of the sweep's cluster, where its trials' runs write (orchestrator.storage.RunStorages)."""
        with self.sessions() as session:
            cluster = session.scalar(select(Sweep.cluster).where(Sweep.id == sweep_id))
        return self.storages.of(cluster)  # with no session open (the registry may read one)

    def after_recording(self, sweep_id: str, tune_ids: set[str]) -> None:
        """Right after the events endpoint committed trial checkpoints: apply retention now. A failure is
        only logged (the events were taken); the loop applies it again."""
        try:
            with self.sessions() as session:
                trial_ids = [t.id for t in sweeps_repo.list_trials(session, sweep_id) if t.tune_id in tune_ids]
            for trial_id in trial_ids:
                self.enforce_retention(trial_id)
        except Exception:
            log.exception("sweep %s: trial retention after new checkpoints failed; the loop will retry", sweep_id)

    def upkeep(self, sweep_id: str, finished: bool) -> None:
        """Retention for every trial of the sweep, then the sweeper (the background loop's pass)."""
        with self.sessions() as session:
            trial_ids = [t.id for t in sweeps_repo.list_trials(session, sweep_id)]
        for trial_id in trial_ids:
            self.enforce_retention(trial_id)
        self.sweep(sweep_id, finished)

    # --- retention -------------------------------------------------------------------------------------

    def enforce_retention(self, trial_id: str) -> list[str]:
        """Delete the trial's checkpoints its retention does not keep: storage first, then the records.
        Returns the paths deleted."""
        with self._busy:
            with self.sessions() as session:
                trial = session.get(Trial, trial_id)
                if trial is None:
                    return []
                sweep_id, tune_id = trial.sweep_id, trial.tune_id
                sweep = session.get(Sweep, sweep_id)
                keep, keep_best = trial_retention(SweepSpec.model_validate(sweep.spec))
                cluster = sweep.cluster
                recorded = [
                    RecordedCheckpoint(p.epoch, p.checkpoint_path, p.step, dict(p.values))
                    for p in sweeps_repo.trial_checkpoints(session, trial_id)
                ]
                served = deployments_repo.referenced_checkpoint_paths(session)
            kept = select_kept(recorded, keep, keep_best)
            storage = self.storages.of(cluster)  # with no session open (the registry may read one)
            deleted = [
                c.path
                for c in recorded
                if c.id not in kept and c.path not in served and self._delete(storage, sweep_id, tune_id, c.path)
            ]
            if deleted:
                self._forget(sweep_id, trial_id, set(deleted))
                log.info("trial %s: retention deleted checkpoint(s) %s", tune_id, ", ".join(deleted))
            return deleted

    def _delete(self, storage: CheckpointStorage, sweep_id: str, tune_id: str, path: str) -> bool:
        """Delete a recorded checkpoint folder of the trial; True when it is gone. Anything that is not a
        ``checkpoint_*`` folder of one of the trial's runs is never deleted (and stays recorded)."""
        run = storage.trial_run(sweep_id, tune_id, path)
        if run is None:
            log.warning(
                "trial %s: checkpoint %s is not in one of its runs' folders; retention leaves it", tune_id, path
            )
            return False
        try:
            storage.delete_checkpoint(run, path)
            return True
        except StorageError as exc:
            log.warning("trial %s: could not delete checkpoint %s (its record stays): %s", tune_id, path, exc)
            return False

    def _forget(self, sweep_id: str, trial_id: str, paths: set[str]) -> None:
        """Clear the records of deleted or vanished folders and choose the trial's (and sweep's) best again,
        under the sweep's lock, as the events endpoint changes them."""
        with self.sessions.begin() as session:
            sweep = lock_sweep(session, sweep_id)
            trial = session.get(Trial, trial_id)
            if sweep is None or trial is None:
                return
            sweeps_repo.forget_trial_checkpoints(session, trial_id, paths)
            spec = SweepSpec.model_validate(sweep.spec)
            refresh_trial_best(session, trial, spec)
            update_best_trial(session, sweep, spec)

    # --- the sweeper -------------------------------------------------------------------------------------

    def sweep(self, sweep_id: str, finished: bool) -> tuple[list[str], list[str]]:
        """Forget recorded checkpoints whose folder is gone; once the sweep has ended, delete the folders
        no epoch records. Returns (folders deleted, records forgotten)."""
        with self._busy:
            with self.sessions() as session:
                recorded = {
                    p.checkpoint_path: (t.id, t.tune_id) for t, p in sweeps_repo.sweep_checkpoints(session, sweep_id)
                }
            # Listed after the rows were read: a recorded folder missing here really is gone.
            storage = self._storage(sweep_id)
            stored = self._stored(storage, sweep_id)
            gone: dict[str, set[str]] = {}
            for path, (trial_id, tune_id) in recorded.items():
                run = storage.trial_run(sweep_id, tune_id, path)
                if run is not None and storage.checkpoint_name(run, path) not in stored.get(run, set()):
                    gone.setdefault(trial_id, set()).add(path)
            for trial_id, paths in gone.items():
                self._forget(sweep_id, trial_id, paths)
                log.warning("sweep %s: checkpoint(s) %s are gone from storage; forgot them", sweep_id, ", ".join(paths))
            deleted: list[str] = []
            if finished:
                deleted = self._delete_orphans(storage, sweep_id, stored)
            return deleted, [path for paths in gone.values() for path in paths]

    @staticmethod
    def _stored(storage: CheckpointStorage, sweep_id: str) -> dict[str, set[str]]:
        """The ``checkpoint_*`` folder names in each of the sweep's trial runs, by run."""
        runs = storage.list_folders(trials_folder(sweep_id))
        return {
            f"{trials_folder(sweep_id)}/{run}": set(storage.list_checkpoints(f"{trials_folder(sweep_id)}/{run}"))
            for run in runs
        }

    def _delete_orphans(self, storage: CheckpointStorage, sweep_id: str, stored: dict[str, set[str]]) -> list[str]:
        with self.sessions() as session:  # again, just before deleting
            recorded = {(p.checkpoint_path, t.tune_id) for t, p in sweeps_repo.sweep_checkpoints(session, sweep_id)}
            served = deployments_repo.referenced_checkpoint_paths(session)
        # A served folder is kept whichever trial's it is: look it up under the tune id its run is named for.
        recorded |= {(path, _run_name(path)) for path in served}
        keep_names = {
            (run, storage.checkpoint_name(run, path))
            for path, tune_id in recorded
            if (run := storage.trial_run(sweep_id, tune_id, path)) is not None
        }
        deleted = []
        for run, names in stored.items():
            for name in sorted(names):
                if (run, name) in keep_names:
                    continue
                path = storage.to_recorded(f"{storage.run_dir(run)}/{name}")
                storage.delete_checkpoint(run, path)
                deleted.append(path)
        if deleted:
            log.info("sweep %s: deleted %d checkpoint folder(s) no trial epoch recorded", sweep_id, len(deleted))
        return deleted


def _run_name(path: str) -> str:
    """The Train run a checkpoint folder is in (``<run>/checkpoint_*``)."""
    return posixpath.basename(posixpath.dirname(posixpath.normpath(path.partition("://")[2] or path)))
