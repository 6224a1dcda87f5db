"""A code upload, from the request's file to a stored package: measured (SHA-256 and size, in chunks,
413 past ORCHESTRATOR_CODE_MAX_MB), looked up (the same bytes in the same project are stored once),
checked and repacked as a zip (``orchestrator.code_archive``), stored (``orchestrator.code_storage``),
then recorded. The heavy steps run outside any database transaction: on SQLite a transaction holds the
write lock (``db/engine.py``). ``UploadSlots`` bounds how many uploads a process handles at once."""

from __future__ import annotations

import hashlib
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import BinaryIO

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from orchestrator import code_archive
from orchestrator.code_archive import ArchiveRejected, Limits
from orchestrator.code_storage import CodeStorage
from orchestrator.db.models import CodePackage
from orchestrator.errors import TooLarge, TooMany
from orchestrator.repositories import code as code_repo
from orchestrator.settings import Settings

CHUNK = 1024 * 1024
# Ray's dashboard takes a request body of at most 100 MiB (aiohttp's client_max_size, Ray's
# DASHBOARD_CLIENT_MAX_SIZE), and the backend PUTs a package to Ray's store as one body. A repacked zip can
# be larger than the upload (a .tar.gz compresses across files, a zip file by file): past this, Ray would
# refuse it at every start, so the upload is refused instead.
RAY_PACKAGE_MAX_BYTES = 100 * 1024 * 1024


# What a 429 asks a client to wait: an upload is checked and stored in seconds.
UPLOAD_RETRY_AFTER_S = 5


class UploadsBusy(TooMany):
    """429: the process is already handling ORCHESTRATOR_CODE_MAX_CONCURRENT_UPLOADS uploads."""

    retry_after_s = UPLOAD_RETRY_AFTER_S


class UploadSlots:
    """At most ``limit`` uploads in progress at once in this process, from the first byte of the body read to
    the package stored (a body spooled to disk, then hashed, checked and repacked). Past it ``UploadsBusy`` at
    once, never a wait: a queue of waiting uploads would hold their bodies and the client's connection."""

    def __init__(self, limit: int):
        self.limit = limit
        self._taken = 0
        self._lock = threading.Lock()

    @contextmanager
    def slot(self) -> Iterator[None]:
        with self._lock:
            if self._taken >= self.limit:
                raise UploadsBusy(
                    f"{self.limit} code uploads are already being received and checked here, the most at once "
                    f"(ORCHESTRATOR_CODE_MAX_CONCURRENT_UPLOADS): send it again in {UPLOAD_RETRY_AFTER_S} s"
                )
            self._taken += 1
        try:
            yield
        finally:
            with self._lock:
                self._taken -= 1


@dataclass(frozen=True)
class Uploaded:
    package: CodePackage
    created: bool  # False: the project already had these bytes (200, nothing stored again)


def measure(upload: BinaryIO, max_bytes: int, max_mb: float) -> tuple[str, int]:
    """The upload's SHA-256 (hex) and size, read in chunks; TooLarge as soon as the count passes the cap."""
    digest = hashlib.sha256()
    size = 0
    upload.seek(0)
    while chunk := upload.read(CHUNK):
        size += len(chunk)
        if size > max_bytes:
            raise TooLarge(f"the code package is larger than ORCHESTRATOR_CODE_MAX_MB ({max_mb:g} MB)")
        digest.update(chunk)
    upload.seek(0)
    return digest.hexdigest(), size


def store_upload(
    sessions: sessionmaker[Session], storage: CodeStorage, settings: Settings, project_id: str, upload: BinaryIO
) -> Uploaded:
    sha256, size = measure(upload, settings.code_max_bytes, settings.code_max_mb)
    with sessions.begin() as session:
        existing = code_repo.get_package(session, project_id, code_repo.api_id(sha256))
        if existing is not None:
            code_repo.mark_used(session, existing)  # uploading it again counts as a use (garbage collection)
            return Uploaded(existing, False)
    limits = Limits(settings.code_max_files, settings.code_max_unpacked_bytes)
    kind, entries = code_archive.inspect(upload, limits)
    if not entries:
        raise ArchiveRejected("the archive holds no files")
    with tempfile.TemporaryFile() as packed:
        files = code_archive.repack(upload, kind, entries, packed, limits)
        package_sha256, package_size = measure(packed, max_bytes=2**63, max_mb=0)
        if package_size > RAY_PACKAGE_MAX_BYTES:
            raise TooLarge(
                f"the code package, stored as a zip for Ray, is {package_size / 2**20:.1f} MiB: more than Ray's "
                f"limit of {RAY_PACKAGE_MAX_BYTES / 2**20:.0f} MiB for a job's working_dir (a .tar.gz compresses "
                "across files, a zip file by file); leave large data out of the code (put it under a data root)"
            )
        storage.put(project_id, sha256, packed)
    row = CodePackage(
        project_id=project_id,
        sha256=sha256,
        size=size,
        file_count=len(files),
        files=[{"path": f.path, "size": f.size} for f in files],
        package_sha256=package_sha256,
        package_size=package_size,
    )
    try:
        with sessions.begin() as session:
            code_repo.add_package(session, row)
    except IntegrityError:  # the same bytes, uploaded at the same time: one row (the file is the same too)
        with sessions() as session:
            existing = code_repo.get_package(session, project_id, code_repo.api_id(sha256))
            if existing is None:
                raise
            return Uploaded(existing, False)
    return Uploaded(row, True)
