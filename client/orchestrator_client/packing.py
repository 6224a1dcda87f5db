"""A directory packed into a code package (a zip), the way ``git`` would see it: ``.gitignore`` files (the
root's and any below it, each for its own folder) and the root's ``.orchignore`` (which wins) are honoured with
pathspec's gitwildmatch rules, and ``.git/`` is always left out.

The zip is deterministic: the same files give the same bytes (sorted paths, fixed timestamps and
permissions), so packing an unchanged directory again uploads to the same package id (the server answers 200).
Symbolic links to files inside the directory are packed as the file they point to; a link that leads out of it
is refused (its target, say ~/.aws/credentials, would otherwise reach the cluster unseen); links to folders are
not followed.
"""

from __future__ import annotations

import os
import stat
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import pathspec

IGNORE_FILES = (".gitignore",)  # read in every folder, for that folder
ROOT_IGNORE_FILE = ".orchignore"  # read in the root only; applied after the .gitignore files
ALWAYS_LEFT_OUT = frozenset({".git"})
FIXED_TIME = (1980, 1, 1, 0, 0, 0)  # the zip format's earliest date: no timestamps in the bytes


class PackError(ValueError):
    """A directory that cannot be packed as it is (empty once ignored, a link out of it): the message says why."""


@dataclass
class Packed:
    """A packed directory: ``file`` (a temporary file, at its start), the paths packed, its size."""

    file: IO[bytes]
    paths: list[str]
    size: int


def _spec(path: Path) -> pathspec.GitIgnoreSpec | None:
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except (FileNotFoundError, IsADirectoryError):
        return None
    return pathspec.GitIgnoreSpec.from_lines(lines)


def _ignored(rules: list[tuple[str, pathspec.GitIgnoreSpec]], relative: str, is_dir: bool) -> bool:
    """The last rule file that has an opinion decides (the root's .orchignore, then the deepest .gitignore)."""
    for base, spec in reversed(rules):
        if base and not relative.startswith(base + "/"):
            continue
        local = relative[len(base) + 1 :] if base else relative
        result = spec.check_file(local + "/" if is_dir else local)
        if result.include is not None:
            return bool(result.include)
    return False


def list_files(root: Path) -> list[str]:
    """The files a package of ``root`` holds, '/'-separated and sorted."""
    root = Path(root)
    if not root.is_dir():
        raise NotADirectoryError(f"{root} is not a directory")
    orchignore = _spec(root / ROOT_IGNORE_FILE)
    gitignores: list[tuple[str, pathspec.GitIgnoreSpec]] = []
    found: list[str] = []
    for folder, dirnames, filenames in os.walk(root):
        base = Path(folder).relative_to(root).as_posix()
        base = "" if base == "." else base
        for name in IGNORE_FILES:
            spec = _spec(Path(folder) / name)
            if spec is not None:
                gitignores.append((base, spec))
        rules = gitignores + ([("", orchignore)] if orchignore else [])
        prefix = f"{base}/" if base else ""
        dirnames[:] = sorted(
            d
            for d in dirnames
            if d not in ALWAYS_LEFT_OUT
            and not os.path.islink(os.path.join(folder, d))
            and not _ignored(rules, prefix + d, is_dir=True)
        )
        for name in filenames:
            full = os.path.join(folder, name)
            if not os.path.isfile(full):  # a FIFO, a socket, a link to nothing
                continue
            if not _ignored(rules, prefix + name, is_dir=False):
                _check_stays_inside(root, full, prefix + name)
                found.append(prefix + name)
    return sorted(found)


def _check_stays_inside(root: Path, full: str, relative: str) -> None:
    if os.path.islink(full) and not Path(full).resolve().is_relative_to(root.resolve()):
        raise PackError(
            f"{relative} is a link to {Path(full).resolve()}, outside {root}: copy the file in, or leave the link "
            f"out with {ROOT_IGNORE_FILE}"
        )


def pack_directory(root: Path) -> Packed:
    """``root``'s files (``list_files``) in a deterministic zip, in a temporary file."""
    root = Path(root)
    paths = list_files(root)
    if not paths:
        raise PackError(f"{root}: no files to pack (all ignored, or the directory is empty)")
    spooled = tempfile.TemporaryFile()  # noqa: SIM115 - handed to the caller open (Packed.file)
    with zipfile.ZipFile(spooled, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for relative in paths:
            source = root / relative
            info = zipfile.ZipInfo(relative, date_time=FIXED_TIME)
            executable = os.stat(source).st_mode & stat.S_IXUSR
            info.external_attr = (0o100755 if executable else 0o100644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            with open(source, "rb") as data, archive.open(info, "w") as entry:
                while chunk := data.read(1 << 20):
                    entry.write(chunk)
    size = spooled.tell()
    spooled.seek(0)
    return Packed(file=spooled, paths=paths, size=size)
