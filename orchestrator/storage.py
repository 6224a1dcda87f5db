"""The control plane's view of checkpoint storage (``ORCHESTRATOR_STORAGE``, Ray Train's storage_path).

A run folder is ``<storage>/<job id>/`` for a job and ``<storage>/<sweep id>/trials/<run>`` for a sweep
trial's Train run (the ``job_id`` arguments below take either); Ray Train writes its checkpoints there as
``checkpoint_*`` folders, next to files of its own (its run snapshot and the like, never touched here).
This module lists those folders, tells how old one is, and deletes one, through ``pyarrow.fs``, so a
local folder and a URI (``s3://bucket/runs``) behave alike. No Ray here: only orchestrator/backend
talks to Ray.

Paths come in two forms: as the database records them (``workers.train.checkpoints.checkpoint_uri``: a
local path, or a URI with the storage's scheme) and as paths on the filesystem (the URI without its
scheme, as pyarrow and Ray use them).
"""

from __future__ import annotations

import logging
import os
import posixpath
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow.fs

from orchestrator_contract.sweeps import is_trial_run, trials_folder

log = logging.getLogger(__name__)

CHECKPOINT_PREFIX = "checkpoint_"


class StorageError(Exception):
    """The storage could not be read or changed; the caller tries again later."""


@dataclass(frozen=True)
class StoredCheckpoint:
    name: str
    path: str  # as the database records it


class StorageRoot:
    """The filesystem of ``ORCHESTRATOR_STORAGE`` (a local folder or any pyarrow URI) and the root path on it,
    opened on first use: resolving a cloud URI may need the network. Checkpoints and code packages share it."""

    def __init__(self, storage_path: str):
        self.storage_path = storage_path.rstrip("/")
        self._lock = threading.Lock()
        self._fs: pyarrow.fs.FileSystem | None = None
        self._root = ""

    @property
    def fs(self) -> pyarrow.fs.FileSystem:
        with self._lock:
            if self._fs is None:
                try:
                    self._fs, root = pyarrow.fs.FileSystem.from_uri(self.storage_path)
                except (OSError, ValueError) as exc:
                    raise StorageError(f"cannot open storage {self.storage_path}: {exc}") from exc
                self._root = root.rstrip("/")
            return self._fs


class CheckpointStorage(StorageRoot):
    def __init__(self, storage_path: str):
        super().__init__(storage_path)
        scheme, separator, _ = self.storage_path.partition("://")
        self.scheme = scheme if separator else None

    def run_dir(self, job_id: str) -> str:
        """The job's run folder, as a path on the filesystem."""
        self.fs  # noqa: B018 (sets the root)
        return f"{self._root}/{job_id}"

    def to_fs_path(self, path: str) -> str | None:
        """A recorded path as a path on this storage's filesystem; None if it has another scheme."""
        scheme, separator, rest = path.partition("://")
        if not separator:
            return path if self.scheme is None else None
        return rest if scheme == self.scheme else None

    def to_recorded(self, fs_path: str) -> str:
        return f"{self.scheme}://{fs_path}" if self.scheme else fs_path

    def checkpoint_name(self, job_id: str, path: str) -> str | None:
        """The folder name when ``path`` (as recorded) is a checkpoint folder directly in the job's run
        folder; None for anything else (which is never deleted or swept)."""
        fs_path = self.to_fs_path(path)
        if fs_path is None:
            return None
        fs_path = posixpath.normpath(fs_path)
        parent, name = posixpath.split(fs_path)
        if parent != posixpath.normpath(self.run_dir(job_id)) or not name.startswith(CHECKPOINT_PREFIX):
            return None
        return name

    def owns_checkpoint(self, run: str, path: str) -> bool:
        """Whether ``path`` (as a driver reports it) is a ``checkpoint_*`` folder directly in the run's own
        folder, also once symbolic links are followed (local storage): a driver may record no other."""
        if self.checkpoint_name(run, path) is None:
            return False
        if self.scheme is not None:  # an object store has no links
            return True
        real = os.path.realpath(self.to_fs_path(path) or "")
        return os.path.dirname(real) == os.path.realpath(self.run_dir(run))

    def trial_run(self, sweep_id: str, tune_id: str, path: str) -> str | None:
        """``<sweep>/trials/<run>`` when ``path`` is a checkpoint folder of one of trial ``tune_id``'s Train
        runs (links followed); None for anything else."""
        fs_path = self.to_fs_path(path)
        if fs_path is None:
            return None
        run_name = posixpath.basename(posixpath.dirname(posixpath.normpath(fs_path)))
        run = f"{trials_folder(sweep_id)}/{run_name}"
        return run if is_trial_run(tune_id, run_name) and self.owns_checkpoint(run, path) else None

    def available(self) -> bool:
        """The storage root exists. If it doesn't (an unmounted volume, a wrong setting), nothing is
        concluded from a missing run folder."""
        try:
            return self.fs.get_file_info(self._root or "/").type == pyarrow.fs.FileType.Directory
        except OSError as exc:
            log.warning("checkpoint storage %s is unreachable: %s", self.storage_path, exc)
            return False

    def list_folders(self, relative: str) -> list[str]:
        """Names of the folders in ``<storage>/<relative>`` (none if it does not exist)."""
        selector = pyarrow.fs.FileSelector(self.run_dir(relative), allow_not_found=True)
        try:
            entries = self.fs.get_file_info(selector)
        except OSError as exc:
            raise StorageError(f"cannot list {self.run_dir(relative)}: {exc}") from exc
        return sorted(e.base_name for e in entries if e.type == pyarrow.fs.FileType.Directory)

    def list_checkpoints(self, job_id: str) -> dict[str, StoredCheckpoint]:
        """The ``checkpoint_*`` folders in the job's run folder by name (none if it has no folder).
        Folders only: Ray's ``checkpoint_manager_snapshot.json`` sits there too."""
        selector = pyarrow.fs.FileSelector(self.run_dir(job_id), allow_not_found=True)
        try:
            entries = self.fs.get_file_info(selector)
        except OSError as exc:
            raise StorageError(f"cannot list {self.run_dir(job_id)}: {exc}") from exc
        return {
            e.base_name: StoredCheckpoint(e.base_name, self.to_recorded(e.path))
            for e in entries
            if e.type == pyarrow.fs.FileType.Directory and e.base_name.startswith(CHECKPOINT_PREFIX)
        }

    def last_modified_ns(self, path: str) -> int | None:
        """When anything in the folder last changed (ns since the epoch); None if the storage can't say."""
        fs_path = self.to_fs_path(path)
        if fs_path is None:
            return None
        try:
            infos = [self.fs.get_file_info(fs_path)]
            infos += self.fs.get_file_info(pyarrow.fs.FileSelector(fs_path, recursive=True, allow_not_found=True))
        except OSError as exc:
            raise StorageError(f"cannot list {path}: {exc}") from exc
        times = [info.mtime_ns for info in infos if info.mtime_ns is not None]
        return max(times, default=None)

    def exists(self, path: str) -> bool | None:
        """Whether a recorded path exists; None when it is not on this storage (another scheme)."""
        fs_path = self.to_fs_path(path)
        if fs_path is None:
            return None
        try:
            return self.fs.get_file_info(fs_path).type != pyarrow.fs.FileType.NotFound
        except OSError as exc:
            raise StorageError(f"cannot check {path}: {exc}") from exc

    def delete_checkpoint(self, job_id: str, path: str) -> None:
        """Delete one checkpoint folder of the job (already gone is fine). Refuses anything that is not a
        ``checkpoint_*`` folder directly in the job's run folder."""
        name = self.checkpoint_name(job_id, path)
        if name is None:
            raise ValueError(f"{path} is not a checkpoint folder of job {job_id} in {self.storage_path}")
        fs_path = f"{self.run_dir(job_id)}/{name}"
        try:
            self.fs.delete_dir(fs_path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            if self.exists(path):
                raise StorageError(f"cannot delete {path}: {exc}") from exc


class RunStorages:
    """Where each cluster's runs keep their folders (checkpoints, archived logs): the cluster's registered
    ``storage_root`` (docs/clusters.md), else the service's own storage (``ORCHESTRATOR_STORAGE``). A run's folder
    is on its own cluster's storage, so a team's dedicated cluster with a root of its own never mounts another
    team's checkpoints. One CheckpointStorage per root, opened on first use."""

    def __init__(
        self, default: CheckpointStorage, root_of: Callable[[str, Any], str | None] = lambda cluster, session: None
    ):
        self.default = default
        # (a cluster's name, the caller's open session or None) -> its storage_root (None: the service's own)
        self._root_of = root_of
        self._opened: dict[str, CheckpointStorage] = {}
        self._lock = threading.Lock()

    def of(self, cluster: str | None, session: Any = None) -> CheckpointStorage:
        """The storage of a run placed on ``cluster`` (None: not placed yet, or placed before clusters existed:
        the default cluster's). ``session``: the caller's open one, if any (the registry may have to read it)."""
        path = storage_path_of(self._root_of(cluster, session) if cluster else None, self.default.storage_path)
        if path == self.default.storage_path:
            return self.default
        with self._lock:
            if path not in self._opened:
                self._opened[path] = CheckpointStorage(path)
            return self._opened[path]


def storage_path_of(storage_root: str | None, service_storage: str) -> str:
    """Where a cluster's runs keep their folders: its ``storage_root``, else the service's own storage."""
    return (storage_root or service_storage).rstrip("/")
