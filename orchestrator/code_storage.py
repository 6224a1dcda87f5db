"""Where code packages live: ``<root>/code/<project id>/<sha256>.zip`` under ``ORCHESTRATOR_CODE_STORAGE`` (else
the checkpoint storage root ``ORCHESTRATOR_STORAGE``; a folder or a pyarrow URI, like ``orchestrator.storage``), one
zip per project and upload, written once and never changed. No Ray here: the backend uploads a package to Ray's
own store.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from typing import BinaryIO

import pyarrow.fs

from orchestrator.storage import StorageError, StorageRoot

CODE_FOLDER = "code"
_HEX = re.compile(r"^[0-9a-f]{64}$")
_PROJECT = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class CodeStorage(StorageRoot):
    def path_of(self, project_id: str, sha256: str) -> str:
        """The package's path on the storage's filesystem; only server-made names (a project id, a hex digest)."""
        if not _PROJECT.match(project_id) or not _HEX.match(sha256):
            raise ValueError(f"not a code package name: {project_id}/{sha256}")
        self.fs  # noqa: B018 (sets the root)
        return f"{self._root}/{CODE_FOLDER}/{project_id}/{sha256}.zip"

    def put(self, project_id: str, sha256: str, source: BinaryIO) -> None:
        """Copy ``source`` (a finished zip) to the package's place, in chunks; written to a temporary name
        first, so a half-written package is never found under its own."""
        path = self.path_of(project_id, sha256)
        partial = f"{path}.partial"
        try:
            self.fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
            source.seek(0)
            with self.fs.open_output_stream(partial) as sink:
                shutil.copyfileobj(source, sink, 1024 * 1024)
            self.fs.move(partial, path)
        except OSError as exc:
            raise StorageError(f"cannot store code package {sha256} of project {project_id}: {exc}") from exc

    def exists(self, project_id: str, sha256: str) -> bool:
        try:
            return self.fs.get_file_info(self.path_of(project_id, sha256)).type == pyarrow.fs.FileType.File
        except OSError as exc:
            raise StorageError(f"cannot check code package {sha256}: {exc}") from exc

    @contextmanager
    def open(self, project_id: str, sha256: str) -> Iterator[BinaryIO]:
        try:
            with self.fs.open_input_stream(self.path_of(project_id, sha256)) as source:
                yield source
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise StorageError(f"cannot read code package {sha256}: {exc}") from exc

    def size(self, project_id: str, sha256: str) -> int:
        return int(self.fs.get_file_info(self.path_of(project_id, sha256)).size or 0)

    def delete(self, project_id: str, sha256: str) -> None:
        """Already gone is fine."""
        try:
            self.fs.delete_file(self.path_of(project_id, sha256))
        except FileNotFoundError:
            pass
        except OSError as exc:
            if self.exists(project_id, sha256):
                raise StorageError(f"cannot delete code package {sha256}: {exc}") from exc
