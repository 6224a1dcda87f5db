"""A code upload, from the request's file to a stored package: measured (SHA-256 and size, in chunks,
413 past ORCHESTRATOR_CODE_MAX_MB), looked up (the same bytes in the same project are stored once),
checked and repacked as a zip (``orchestrator.code_archive``), stored (``orchestrator.code_storage``),
then recorded. The heavy steps run outside any database transaction: on SQLite a transaction holds the
write lock (``db/engine.py``)."""

from __future__ import annotations

import hashlib
import tempfile
from dataclasses import dataclass
from typing import BinaryIO

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from orchestrator import code_archive
from orchestrator.code_archive import ArchiveRejected, Limits
from orchestrator.code_storage import CodeStorage
from orchestrator.db.models import CodePackage
from orchestrator.errors import TooLarge
from orchestrator.repositories import code as code_repo
from orchestrator.settings import Settings

CHUNK = 1024 * 1024
# Ray's dashboard takes a request body of at most 100 MiB (aiohttp's client_max_size, Ray's
# DASHBOARD_CLIENT_MAX_SIZE), and the backend PUTs a package to Ray's store as one body. A repacked zip can
# be larger than the upload (a .tar.gz compresses across files, a zip file by file): past this, Ray would
# refuse it at every start, so the upload is refused instead.
RAY_PACKAGE_MAX_BYTES = 100 * 1024 * 1024


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
