"""An uploaded code archive (``.zip`` or ``.tar.gz`` of a directory), checked entry by entry and rewritten as
the zip Ray's ``runtime_env`` ``working_dir`` takes.

Nothing is extracted: ``inspect`` reads only the archive's listing (names, kinds, sizes) and refuses the
whole archive at the first bad entry (an absolute path, a ``..`` component, a link, a device file or FIFO,
too many files, too many bytes unpacked), before anything is stored; ``repack`` then copies each regular
file's bytes, in chunks, from the upload into a new zip under its checked name, counting what it really
reads (a zip's declared sizes may lie). No name from the archive ever becomes a path on this machine.

Reading the listing is bounded too (docs/security.md): every entry counts, folders and links included (at most
``Limits.max_entries``), and so do the bytes of the listing, names included (``Limits.max_listing_bytes``;
``MAX_ENTRY_HEADER_BYTES`` for one tar entry's headers), and reading stops at the first limit passed. A
tar is read header by header and none is kept (``TarFile`` keeps every header it reads in ``members``:
emptied at each step); a zip's central directory is measured and its records counted before ``zipfile``
reads it whole into memory.

A directory archived with its folder (``zip -r code.zip mydir``: every file under ``mydir/``) is stored
without that one top folder, so the package's root is the directory's contents either way.
"""

from __future__ import annotations

import io
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
_GZIP_MAGIC = b"\x1f\x8b"
_FIXED_TIME = (1980, 1, 1, 0, 0, 0)  # the same files give the same stored zip
# A name longer than Linux's PATH_MAX could not be a file on a node anyway.
MAX_NAME_BYTES = 4096
# The listing's bytes an entry may take on average: a tar header (512) and a pax or long-name record
# (GNU tar --format=posix, macOS tar's extended attributes) with room; a zip record is ~100 bytes.
LISTING_BYTES_PER_ENTRY = 2048
# One tar entry's headers at most (its header, long name, pax and sparse records), read before TarFile
# hands the entry over: a pax record or a chain of sparse blocks past it would be read whole into memory.
MAX_ENTRY_HEADER_BYTES = 64 * 1024
# Global pax records (git archive writes one, the commit id): TarFile applies them to every later entry.
MAX_GLOBAL_PAX_RECORDS = 16
_RAW_CHUNK = 16 * 1024  # compressed bytes read at a time: reading stops soon after the first limit
_INFLATE_CHUNK = 64 * 1024
_KEEP_BEHIND = 512  # TarFile.next() steps back one byte: a block of what was read is kept
_GZIP_WBITS = 16 + zlib.MAX_WBITS  # a gzip member, header and trailer checked by zlib


class ArchiveRejected(Invalid):
    """422: not an archive, or an entry no code package may hold (the message names it)."""


class ArchiveTooLarge(TooLarge):
    """413: the archive unpacks to more than ORCHESTRATOR_CODE_MAX_UNPACKED_MB."""


@dataclass(frozen=True)
class Limits:
    max_files: int
    max_unpacked_bytes: int

    @property
    def max_entries(self) -> int:
        """Entries of any kind: each file and, at most, a folder entry of its own."""
        return 2 * self.max_files

    @property
    def max_listing_bytes(self) -> int:
        return self.max_entries * LISTING_BYTES_PER_ENTRY


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
    with _reading(kind):
        if kind == "zip":
            _check_zip_listing(upload, limits)
            with zipfile.ZipFile(upload) as archive:
                entries = list(_zip_entries(archive, limits))
        else:
            with _tar(upload, limits) as (archive, stream):
                entries = [entry for _, entry in _tar_walk(archive, stream, limits) if entry is not None]
    upload.seek(0)
    return kind, _strip_top_folder(entries)


def repack(upload: BinaryIO, kind: str, entries: list[_Entry], out: BinaryIO, limits: Limits) -> list[PackedFile]:
    """Write ``entries`` (from ``inspect``) into a new zip on ``out``; returns the files and their real sizes."""
    total = 0
    packed = []
    with _reading(kind), zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as target:
        for entry, source in _sources(upload, kind, entries, limits):
            info = zipfile.ZipInfo(entry.path, date_time=_FIXED_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = (stat.S_IFREG | 0o644) << 16
            size = 0
            with target.open(info, "w") as sink:
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
def _reading(kind: str) -> Iterator[None]:
    """What the archive libraries raise on bad bytes, as a 422 saying the archive could not be read."""
    try:
        yield
    except (ArchiveRejected, ArchiveTooLarge):
        raise
    except (zipfile.BadZipFile, tarfile.TarError, EOFError, OSError, ValueError, RuntimeError, zlib.error) as exc:
        # RuntimeError: an encrypted zip entry; NotImplementedError (a RuntimeError): an unknown compression
        raise ArchiveRejected(f"the {kind} archive could not be read: {exc}") from None


def _sources(upload: BinaryIO, kind: str, entries: list[_Entry], limits: Limits) -> Iterator[tuple[_Entry, BinaryIO]]:
    """Each entry to keep with a file object over its bytes, in the archive's order."""
    upload.seek(0)
    if kind == "zip":
        with zipfile.ZipFile(upload) as archive:
            for entry in entries:
                with archive.open(entry.name) as source:
                    yield entry, source
        return
    wanted = {entry.name: entry for entry in entries}  # inspect refused the same name twice
    with _tar(upload, limits) as (archive, stream):
        for member, _ in _tar_walk(archive, stream, limits):
            entry = wanted.get(member.name)
            if entry is not None:
                source = archive.extractfile(member)  # a file object over the member's bytes: nothing is written
                if source is None:
                    raise ArchiveRejected(f"entry {_shown(member.name)} is not a regular file")
                with stream.file_bytes(), source:
                    yield entry, source


# --- zip -----------------------------------------------------------------------------------------


def _check_zip_listing(upload: BinaryIO, limits: Limits) -> None:
    """Before ``zipfile`` reads the central directory into memory and makes an object per record: its size,
    from the end record, then its records counted one by one. The end record is read by ``zipfile``'s own
    reader (private: tests/security/test_code_packages_are_checked.py notices a change), so these are the very numbers
    ``ZipFile`` then trusts; its declared entry count may lie, so the records are counted as ``ZipFile`` walks
    them."""
    end = zipfile._EndRecData(upload)
    if end is None:
        raise ArchiveRejected("the zip archive could not be read: no end of central directory record")
    size = end[zipfile._ECD_SIZE]
    if end[zipfile._ECD_ENTRIES_TOTAL] > limits.max_entries:
        raise _too_many_entries(limits, end[zipfile._ECD_ENTRIES_TOTAL])
    if size > limits.max_listing_bytes:
        raise _listing_too_large(limits)
    start = end[zipfile._ECD_LOCATION] - size  # where ZipFile looks, data prepended or not
    if end[zipfile._ECD_SIGNATURE] == zipfile.stringEndArchive64:
        start -= zipfile.sizeEndCentDir64 + zipfile.sizeEndCentDir64Locator
    upload.seek(start)
    directory = upload.read(size)
    upload.seek(0)
    at = records = 0
    while at + 46 <= len(directory) and directory[at : at + 4] == b"PK\x01\x02":
        records += 1
        if records > limits.max_entries:
            raise _too_many_entries(limits)
        name, extra, comment = struct.unpack("<HHH", directory[at + 28 : at + 34])
        at += 46 + name + extra + comment


def _zip_entries(archive: zipfile.ZipFile, limits: Limits) -> Iterator[_Entry]:
    declared = 0
    files = 0
    for number, info in enumerate(archive.infolist(), 1):
        _check_entry(number, info.filename, limits)
        path = _checked_path(info.filename)
        kind = stat.S_IFMT(info.external_attr >> 16)  # the Unix file type, when the zip says one (0: it doesn't)
        if info.is_dir() or kind == stat.S_IFDIR:
            continue
        if kind and kind != stat.S_IFREG:
            what = "a symbolic link" if kind == stat.S_IFLNK else "not a regular file (a device, FIFO or socket)"
            raise ArchiveRejected(f"entry {_shown(info.filename)} is {what}: only files and folders are allowed")
        if path is None:
            continue
        files += 1
        declared += info.file_size
        _check_bounds(files, declared, limits)
        yield _Entry(info.filename, path, info.file_size)


# --- tar.gz --------------------------------------------------------------------------------------


class _Gunzipped:
    """A .tar.gz's tar bytes, as ``TarFile`` reads them: inflated by zlib (whose C code parses the gzip header
    too: the gzip module reads a header's file name byte by byte), forward only (a block kept behind for
    the one-byte step back ``TarFile.next()`` takes), a few KB at a time. What ``TarFile`` reads outside
    ``file_bytes()`` is headers: counted per entry and in all, and refused before it is read past a limit."""

    def __init__(self, upload: BinaryIO, limits: Limits):
        self._upload = upload
        self._limits = limits
        self._inflate: zlib._Decompress | None = None  # None between two gzip members
        self._input = b""  # compressed bytes not yet inflated
        self._buffer = bytearray()
        self._at = 0  # the next byte of _buffer to read
        self._pos = 0  # the tar stream's position
        self._ended = False
        self._counting = True
        self.entry_bytes = 0  # headers read since _tar_walk last reset it: one entry's
        self.listing_bytes = 0

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            raise ValueError("the tar stream is read in sized pieces only")
        if self._counting:
            self._count(size)
        self._fill(size)
        data = bytes(self._buffer[self._at : self._at + size])
        self._advance(len(data))
        return data

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence != io.SEEK_SET or offset < self._pos - self._at:
            raise io.UnsupportedOperation("the tar stream is read forward only")
        if offset <= self._pos:
            self._at -= self._pos - offset
            self._pos = offset
        while self._pos < offset:  # skip: a file's bytes that are not needed now
            self._fill(min(offset - self._pos, _INFLATE_CHUNK))
            step = min(offset - self._pos, len(self._buffer) - self._at)
            if not step:
                break  # the end: TarFile's next read finds nothing and says so
            self._advance(step)
        return self._pos

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    @contextmanager
    def file_bytes(self) -> Iterator[None]:
        """A file's bytes are read here: not headers, not counted (``repack`` counts them)."""
        self._counting = False
        try:
            yield
        finally:
            self._counting = True

    def _count(self, size: int) -> None:
        if self.entry_bytes + size > MAX_ENTRY_HEADER_BYTES:
            raise ArchiveRejected(
                f"an entry's headers (its name, long-name, pax or sparse records) take more than "
                f"{MAX_ENTRY_HEADER_BYTES // 1024} KiB: make the archive without extended attributes "
                "(tar --no-xattrs, or COPYFILE_DISABLE=1 on macOS)"
            )
        if self.listing_bytes + size > self._limits.max_listing_bytes:
            raise _listing_too_large(self._limits)
        self.entry_bytes += size
        self.listing_bytes += size

    def _fill(self, size: int) -> None:
        while len(self._buffer) - self._at < size and not self._ended:
            self._inflate_some(size - (len(self._buffer) - self._at))

    def _inflate_some(self, wanted: int) -> None:
        if not self._input:
            self._input = self._upload.read(_RAW_CHUNK)
            if not self._input:
                if self._inflate is not None:
                    raise ArchiveRejected("the tar.gz archive could not be read: its gzip data ends early")
                self._ended = True
                return
        if self._inflate is None:  # a gzip member starts, after the zero padding gzip allows between members
            self._input = self._input.lstrip(b"\0")
            if not self._input:
                return
            self._inflate = zlib.decompressobj(_GZIP_WBITS)
        self._buffer += self._inflate.decompress(self._input, max(wanted, _INFLATE_CHUNK))
        if self._inflate.eof:
            self._input = self._inflate.unused_data
            self._inflate = None
        else:
            self._input = self._inflate.unconsumed_tail

    def _advance(self, count: int) -> None:
        self._at += count
        self._pos += count
        if self._at > _KEEP_BEHIND + _INFLATE_CHUNK:
            del self._buffer[: self._at - _KEEP_BEHIND]
            self._at = _KEEP_BEHIND


@contextmanager
def _tar(upload: BinaryIO, limits: Limits) -> Iterator[tuple[tarfile.TarFile, _Gunzipped]]:
    upload.seek(0)
    stream = _Gunzipped(upload, limits)
    with tarfile.TarFile(fileobj=stream) as archive:  # a plain tar over the inflated stream: read mode
        yield archive, stream


def _tar_walk(
    archive: tarfile.TarFile, stream: _Gunzipped, limits: Limits
) -> Iterator[tuple[tarfile.TarInfo, _Entry | None]]:
    """Every header in turn, each checked, with the regular file it names (None for a folder or the root);
    stops at the first bad entry or limit passed. No header is kept."""
    entries = files = unpacked = 0
    while True:
        stream.entry_bytes = 0
        member = archive.next()
        archive.members.clear()  # TarFile appends every header it reads here: keep none
        if member is None:
            return
        entries += 1
        _check_entry(entries, member.name, limits)
        if len(archive.pax_headers) > MAX_GLOBAL_PAX_RECORDS:
            raise ArchiveRejected(f"the archive's global pax headers hold more than {MAX_GLOBAL_PAX_RECORDS} records")
        path = _checked_path(member.name)
        if member.issym():
            raise ArchiveRejected(f"entry {_shown(member.name)} is a symbolic link: only files and folders are allowed")
        if member.islnk():
            raise ArchiveRejected(f"entry {_shown(member.name)} is a hard link: only files and folders are allowed")
        if member.isdir() or (member.isreg() and path is None):
            yield member, None
            continue
        if not member.isreg():
            raise ArchiveRejected(
                f"entry {_shown(member.name)} is not a regular file (a device, FIFO or socket): only files and "
                "folders are allowed"
            )
        files += 1
        unpacked += member.size
        _check_bounds(files, unpacked, limits)  # before TarFile skips the member's bytes to the next header
        yield member, _Entry(member.name, path, member.size)


# --- both ----------------------------------------------------------------------------------------


def _check_entry(number: int, name: str, limits: Limits) -> None:
    """Every entry counts, whatever its kind; so does a long name."""
    if number > limits.max_entries:
        raise _too_many_entries(limits)
    if len(name.encode("utf-8", "surrogateescape")) > MAX_NAME_BYTES:
        raise ArchiveRejected(f"entry {_shown(name)}: a name longer than {MAX_NAME_BYTES} bytes is not allowed")


def _too_many_entries(limits: Limits, declared: int | None = None) -> ArchiveRejected:
    found = f"lists {declared} entries: more than" if declared is not None else "holds more than"
    return ArchiveRejected(
        f"the archive {found} {limits.max_entries} entries (files, folders and links together: at most twice "
        "ORCHESTRATOR_CODE_MAX_FILES)"
    )


def _listing_too_large(limits: Limits) -> ArchiveRejected:
    return ArchiveRejected(
        f"the archive's listing (its entries' headers and names) is larger than {limits.max_listing_bytes} bytes: "
        f"{LISTING_BYTES_PER_ENTRY} bytes an entry on average for at most {limits.max_entries} entries (twice "
        "ORCHESTRATOR_CODE_MAX_FILES)"
    )


def _shown(name: str) -> str:
    """An entry's name in a message: its start, when it is long."""
    return repr(name if len(name) <= 200 else name[:200] + "...")


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
