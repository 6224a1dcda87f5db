"""An uploaded code archive (``.zip`` or ``.tar.gz`` of a directory), checked entry by entry and rewritten as
the zip Ray's ``runtime_env`` ``working_dir`` takes.

Nothing is extracted: ``inspect`` reads only the archive's listing (names, kinds, sizes) and refuses the
whole archive at the first bad entry (an absolute path, a ``..`` component, a link, a device file or FIFO,
too many files, too many bytes unpacked), before anything is stored; ``repack`` then copies each regular
file's bytes, in chunks, from the upload into a new zip under its checked name, counting what it really
reads (a zip's declared sizes may lie). No name from the archive ever becomes a path on this machine.

A directory archived with its folder (``zip -r code.zip mydir``: every file under ``mydir/``) is stored
without that one top folder, so the package's root is the directory's contents either way.
"""

from __future__ import annotations

import stat
import struct
import tarfile
import zipfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import BinaryIO

from orchestrator.errors import Invalid, TooLarge

CHUNK = 1024 * 1024
_ZIP_EOCD = b"PK\x05\x06"
_GZIP_MAGIC = b"\x1f\x8b"
_FIXED_TIME = (1980, 1, 1, 0, 0, 0)  # the same files give the same stored zip


class ArchiveRejected(Invalid):
    """422: not an archive, or an entry no code package may hold (the message names it)."""


class ArchiveTooLarge(TooLarge):
    """413: the archive unpacks to more than ORCHESTRATOR_CODE_MAX_UNPACKED_MB."""


@dataclass(frozen=True)
class Limits:
    max_files: int
    max_unpacked_bytes: int


@dataclass(frozen=True)
class PackedFile:
    path: str  # in the package, relative, '/'-separated
    size: int


@dataclass(frozen=True)
class _Entry:
    name: str  # as the archive names it (to read it back)
    path: str  # checked, normalised
    size: int


def kind_of(upload: BinaryIO) -> str:
    """``"zip"`` or ``"tar.gz"`` by the bytes (never by a file name); ArchiveRejected for anything else."""
    upload.seek(0)
    head = upload.read(4)
    upload.seek(0)
    if head.startswith(_GZIP_MAGIC):
        return "tar.gz"
    if head.startswith(b"PK") and zipfile.is_zipfile(upload):
        upload.seek(0)
        return "zip"
    raise ArchiveRejected("the upload is not a .zip or .tar.gz archive")


def inspect(upload: BinaryIO, limits: Limits) -> tuple[str, list[_Entry]]:
    """Every entry checked (see the module docstring); returns the kind and the regular files to keep."""
    kind = kind_of(upload)
    if kind == "zip":
        declared = zip_entry_count(upload)
        if declared is not None and declared > 2 * limits.max_files:  # files, and a folder entry each at most
            raise ArchiveRejected(
                f"the archive lists {declared} entries: more than {limits.max_files} files "
                "(ORCHESTRATOR_CODE_MAX_FILES)"
            )
    with _opened(upload, kind) as archive:
        entries = list(_zip_entries(archive, limits) if kind == "zip" else _tar_entries(archive, limits))
    upload.seek(0)
    return kind, _strip_top_folder(entries)


def repack(upload: BinaryIO, kind: str, entries: list[_Entry], out: BinaryIO, limits: Limits) -> list[PackedFile]:
    """Write ``entries`` (from ``inspect``) into a new zip on ``out``; returns the files and their real sizes."""
    total = 0
    packed = []
    with _opened(upload, kind) as archive, zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as target:
        for entry in entries:
            info = zipfile.ZipInfo(entry.path, date_time=_FIXED_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = (stat.S_IFREG | 0o644) << 16
            size = 0
            with _member(archive, kind, entry.name) as source, target.open(info, "w") as sink:
                while chunk := source.read(CHUNK):
                    size += len(chunk)
                    total += len(chunk)
                    if total > limits.max_unpacked_bytes:
                        raise _unpacked_too_large(limits)
                    sink.write(chunk)
            packed.append(PackedFile(entry.path, size))
    upload.seek(0)
    return packed


@contextmanager
def _opened(upload: BinaryIO, kind: str) -> Iterator[zipfile.ZipFile | tarfile.TarFile]:
    upload.seek(0)
    try:
        if kind == "zip":
            with zipfile.ZipFile(upload) as archive:
                yield archive
        else:
            with tarfile.open(fileobj=upload, mode="r:gz") as archive:
                yield archive
    except ArchiveRejected:
        raise
    except (zipfile.BadZipFile, tarfile.TarError, EOFError, OSError, ValueError, RuntimeError, zlib.error) as exc:
        # RuntimeError: an encrypted zip entry; NotImplementedError (a RuntimeError): an unknown compression
        raise ArchiveRejected(f"the {kind} archive could not be read: {exc}") from None


@contextmanager
def _member(archive, kind: str, name: str) -> Iterator[BinaryIO]:
    if kind == "zip":
        with archive.open(name) as source:
            yield source
        return
    source = archive.extractfile(name)  # a file object over the member's bytes: nothing is written
    if source is None:
        raise ArchiveRejected(f"entry {name!r} is not a regular file")
    with source:
        yield source


def _checked_path(name: str) -> str | None:
    """The entry's path in the package ('/'-separated, relative), None for the archive's root itself;
    ArchiveRejected for an absolute path or a ``..`` component (what could escape a target folder)."""
    if "\x00" in name or "\\" in name:
        raise ArchiveRejected(f"entry {name!r}: a name with a backslash or NUL is not allowed")
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        raise ArchiveRejected(f"entry {name!r}: absolute paths are not allowed")
    parts = [p for p in PurePosixPath(name).parts if p != "."]
    if ".." in parts:
        raise ArchiveRejected(f"entry {name!r}: '..' in a path is not allowed")
    return "/".join(parts) or None


def _zip_entries(archive: zipfile.ZipFile, limits: Limits) -> Iterator[_Entry]:
    declared = 0
    files = 0
    for info in archive.infolist():
        path = _checked_path(info.filename)
        kind = stat.S_IFMT(info.external_attr >> 16)  # the Unix file type, when the zip says one (0: it doesn't)
        if info.is_dir() or kind == stat.S_IFDIR:
            continue
        if kind and kind != stat.S_IFREG:
            what = "a symbolic link" if kind == stat.S_IFLNK else "not a regular file (a device, FIFO or socket)"
            raise ArchiveRejected(f"entry {info.filename!r} is {what}: only files and folders are allowed")
        if path is None:
            continue
        files += 1
        declared += info.file_size
        _check_bounds(files, declared, limits)
        yield _Entry(info.filename, path, info.file_size)


def _tar_entries(archive: tarfile.TarFile, limits: Limits) -> Iterator[_Entry]:
    unpacked = 0
    files = 0
    for member in archive:  # reads headers one at a time; stops at the first bad one
        path = _checked_path(member.name)
        if member.issym():
            raise ArchiveRejected(f"entry {member.name!r} is a symbolic link: only files and folders are allowed")
        if member.islnk():
            raise ArchiveRejected(f"entry {member.name!r} is a hard link: only files and folders are allowed")
        if member.isdir():
            continue
        if not member.isreg():
            raise ArchiveRejected(
                f"entry {member.name!r} is not a regular file (a device, FIFO or socket): only files and folders "
                "are allowed"
            )
        if path is None:
            continue
        files += 1
        unpacked += member.size
        _check_bounds(files, unpacked, limits)
        yield _Entry(member.name, path, member.size)


def _check_bounds(files: int, unpacked: int, limits: Limits) -> None:
    if files > limits.max_files:
        raise ArchiveRejected(f"the archive holds more than {limits.max_files} files (ORCHESTRATOR_CODE_MAX_FILES)")
    if unpacked > limits.max_unpacked_bytes:
        raise _unpacked_too_large(limits)


def _unpacked_too_large(limits: Limits) -> ArchiveTooLarge:
    return ArchiveTooLarge(
        f"the archive unpacks to more than {limits.max_unpacked_bytes / 1024 / 1024:g} MB "
        "(ORCHESTRATOR_CODE_MAX_UNPACKED_MB)"
    )


def _strip_top_folder(entries: list[_Entry]) -> list[_Entry]:
    """Duplicate paths refused; one folder holding everything dropped from every path."""
    seen = set()
    for entry in entries:
        if entry.path in seen:
            raise ArchiveRejected(f"entry {entry.name!r}: the archive holds {entry.path!r} twice")
        seen.add(entry.path)
    tops = {entry.path.split("/", 1)[0] for entry in entries}
    if len(tops) == 1 and all("/" in entry.path for entry in entries):
        top = tops.pop()
        return [_Entry(e.name, e.path[len(top) + 1 :], e.size) for e in entries]
    return entries


def zip_entry_count(upload: BinaryIO) -> int | None:
    """The entry count a zip's end record declares (read before ``zipfile`` loads the whole central
    directory into memory); None when there is no plain end record (zipfile then decides)."""
    upload.seek(0, 2)
    size = upload.tell()
    upload.seek(max(0, size - 65_557))
    tail = upload.read()
    upload.seek(0)
    at = tail.rfind(_ZIP_EOCD)
    if at < 0 or len(tail) < at + 22:
        return None
    return struct.unpack("<H", tail[at + 10 : at + 12])[0]
