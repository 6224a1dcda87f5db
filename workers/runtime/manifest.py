"""Checkpoint manifests: how a checkpoint proves that it was written completely.

Every rank writes its part of a checkpoint into its own folder (``workers.runtime.checkpoint_io``) and, last,
``manifests/rank-NNNNN.json`` there, listing every other file of its part:

    {"format": 1, "rank": 0, "world_size": 2, "files": {"model.pt": {"size": 1234, "sha256": "..."}}}

Ray Train (or ``LocalContext``) then merges the ranks' folders into one checkpoint folder. A checkpoint
is complete when the manifests of ranks 0 .. world_size-1 are all there, agree on the world size, and
every file they list is there with its size (and, when asked, its SHA-256). Copying to storage goes
file by file in no set order, so it is this check, not the order of writing, that tells a whole
checkpoint from one a crash cut short: a missing manifest, a missing or short file all fail it.

Everything here works on any pyarrow filesystem: a local folder, or a storage URI (``s3://...``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import posixpath
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pyarrow.fs

log = logging.getLogger(__name__)

MANIFEST_DIR = "manifests"
MANIFEST_FORMAT = 1
CHECKPOINT_PREFIX = "checkpoint_"
_MANIFEST_NAME = re.compile(r"^rank-(\d{5,})\.json$")
_CHUNK = 1 << 20
_MAX_PROBLEMS_SHOWN = 3


def manifest_name(rank: int) -> str:
    return f"rank-{rank:05d}.json"


def write_manifest(directory: str | os.PathLike, *, rank: int, world_size: int) -> dict:
    """List every file of this rank's part in ``directory`` (a local folder) with its size and SHA-256;
    call it after the rank has written all of them. Returns the manifest."""
    directory = Path(directory)
    files = {}
    for path in sorted(directory.rglob("*")):
        relative = path.relative_to(directory)
        if path.is_file() and relative.parts[0] != MANIFEST_DIR:
            with open(path, "rb") as file:
                digest = hashlib.file_digest(file, "sha256").hexdigest()
            files[relative.as_posix()] = {"size": path.stat().st_size, "sha256": digest}
    manifest = {"format": MANIFEST_FORMAT, "rank": rank, "world_size": world_size, "files": files}
    target = directory / MANIFEST_DIR / manifest_name(rank)
    target.parent.mkdir(exist_ok=True)
    partial = target.with_name(f".{target.name}.partial")
    partial.write_text(json.dumps(manifest, indent=1, sort_keys=True))
    os.replace(partial, target)  # the manifest appears whole or not at all
    return manifest


def add_to_manifest(directory: str | os.PathLike, relative: str, *, rank: int = 0) -> None:
    """List one more file, written later into a whole checkpoint (a local folder), in rank ``rank``'s
    manifest: ``python -m workers.train.export_full``'s ``model.pt``, so the checkpoint still verifies whole."""
    directory = Path(directory)
    target = directory / MANIFEST_DIR / manifest_name(rank)
    manifest = json.loads(target.read_text())
    with open(directory / relative, "rb") as file:
        digest = hashlib.file_digest(file, "sha256").hexdigest()
    manifest["files"][relative] = {"size": (directory / relative).stat().st_size, "sha256": digest}
    partial = target.with_name(f".{target.name}.partial")
    partial.write_text(json.dumps(manifest, indent=1, sort_keys=True))
    os.replace(partial, target)


@dataclass(frozen=True)
class Verification:
    """The outcome of ``verify_checkpoint``: true when the checkpoint is whole, else ``problem`` says why."""

    path: str
    problem: str = ""
    world_size: int = 0
    files: int = 0
    size_bytes: int = 0  # of the files the manifests list

    @property
    def ok(self) -> bool:
        return not self.problem

    def __bool__(self) -> bool:
        return self.ok


def resolve(
    location: str | os.PathLike, filesystem: pyarrow.fs.FileSystem | None = None
) -> tuple[pyarrow.fs.FileSystem, str]:
    """``(filesystem, path on it)``: with ``filesystem`` the location is already a path on it; without, a
    local path or a URI (``s3://bucket/runs/...``)."""
    location = os.fspath(location)
    if filesystem is not None:
        return filesystem, location
    if "://" not in location:
        location = os.path.abspath(location)
    return pyarrow.fs.FileSystem.from_uri(location)


def verify_checkpoint(
    location: str | os.PathLike, filesystem: pyarrow.fs.FileSystem | None = None, *, checksums: bool = True
) -> Verification:
    """Is the checkpoint at ``location`` whole? Every rank's manifest is there and every file they list is
    there with the listed size and, with ``checksums``, the listed SHA-256 (which reads every byte)."""
    fs, path = resolve(location, filesystem)
    path = path.rstrip("/")

    def failed(problem: str, **counts) -> Verification:
        return Verification(path, problem, **counts)

    info = fs.get_file_info(path)
    if info.type == pyarrow.fs.FileType.NotFound:
        return failed("the checkpoint folder does not exist")
    if info.type != pyarrow.fs.FileType.Directory:
        return failed("not a folder")
    entries = fs.get_file_info(pyarrow.fs.FileSelector(f"{path}/{MANIFEST_DIR}", allow_not_found=True))
    manifests: dict[int, dict] = {}
    for entry in entries:
        match = _MANIFEST_NAME.match(entry.base_name)
        if entry.type != pyarrow.fs.FileType.File or not match:
            continue
        try:
            with fs.open_input_stream(entry.path) as stream:
                manifest = json.loads(stream.read())
            rank, world_size, files = manifest["rank"], manifest["world_size"], manifest["files"]
            if rank != int(match.group(1)) or not isinstance(world_size, int) or not isinstance(files, dict):
                raise ValueError("its fields do not match its name")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            return failed(f"manifest {entry.base_name} is unreadable: {exc}")
        manifests[rank] = manifest
    if not manifests:
        return failed(f"no manifest in {MANIFEST_DIR}/: the save was cut short (or predates manifests)")
    world_sizes = {m["world_size"] for m in manifests.values()}
    if len(world_sizes) != 1:
        return failed(f"the rank manifests disagree on the world size: {sorted(world_sizes)}")
    (world_size,) = world_sizes
    missing = sorted(set(range(world_size)) - manifests.keys())
    if missing:
        return failed(f"no manifest from rank(s) {_some(map(str, missing))} of {world_size}: the save was cut short")

    listed = {name: spec for m in manifests.values() for name, spec in m["files"].items()}
    counts = {"world_size": world_size, "files": len(listed), "size_bytes": sum(s["size"] for s in listed.values())}
    names = sorted(listed)
    infos = fs.get_file_info([f"{path}/{name}" for name in names]) if names else []
    problems = []
    for name, info in zip(names, infos, strict=False):
        expected = listed[name]["size"]
        if info.type != pyarrow.fs.FileType.File:
            problems.append(f"{name} is missing")
        elif info.size != expected:
            problems.append(f"{name} is {info.size} bytes, its manifest says {expected}")
    if not problems and checksums:
        for name in names:
            if _sha256(fs, f"{path}/{name}") != listed[name]["sha256"]:
                problems.append(f"{name} does not match its SHA-256")
    if problems:
        return failed(_some(problems, "; "), **counts)
    return Verification(path, **counts)


def checkpoint_folders(run_dir: str | os.PathLike, filesystem: pyarrow.fs.FileSystem | None = None) -> list[str]:
    """The ``checkpoint_*`` folders directly in a run's folder, newest first.

    Newest by name: Ray Train names them ``checkpoint_<date and time>``, ``LocalContext``
    ``checkpoint_<step, zero-padded>``; both sort in the order they were written.
    """
    fs, path = resolve(run_dir, filesystem)
    entries = fs.get_file_info(pyarrow.fs.FileSelector(path.rstrip("/"), allow_not_found=True))
    folders = [
        e for e in entries if e.type == pyarrow.fs.FileType.Directory and e.base_name.startswith(CHECKPOINT_PREFIX)
    ]
    return [e.path for e in sorted(folders, key=lambda e: e.base_name, reverse=True)]


def newest_verified_checkpoint(
    run_dir: str | os.PathLike,
    filesystem: pyarrow.fs.FileSystem | None = None,
    *,
    exclude: Iterable[str] = (),
    checksums: bool = True,
) -> str | None:
    """The newest ``checkpoint_*`` folder of the run that verifies (a path on the filesystem), or None."""
    fs, path = resolve(run_dir, filesystem)
    skip = {p.rstrip("/") for p in exclude}
    for folder in checkpoint_folders(path, fs):
        if folder in skip:
            continue
        verification = verify_checkpoint(folder, fs, checksums=checksums)
        if verification:
            return folder
        log.info("skipping checkpoint %s: %s", folder, verification.problem)
    return None


def choose_resume_checkpoint(
    candidate: str | os.PathLike, filesystem: pyarrow.fs.FileSystem | None = None
) -> str | None:
    """The checkpoint to resume from: ``candidate`` when it verifies (checksums included); otherwise the
    newest checkpoint of the same run folder that does, with a warning naming what was skipped and why;
    None when there is none (a fresh start). Returns a path on the filesystem."""
    fs, path = resolve(candidate, filesystem)
    path = path.rstrip("/")
    verification = verify_checkpoint(path, fs)
    if verification:
        return path
    run_dir = posixpath.dirname(path)
    fallback = newest_verified_checkpoint(run_dir, fs, exclude=[path])
    log.warning(
        "not resuming from checkpoint %s: %s; %s",
        path,
        verification.problem,
        f"resuming from {fallback}, the newest complete checkpoint of the run, instead"
        if fallback
        else f"no complete checkpoint in {run_dir}: starting from scratch",
    )
    return fallback


def _sha256(fs: pyarrow.fs.FileSystem, path: str) -> str:
    digest = hashlib.sha256()
    with fs.open_input_stream(path) as stream:
        while chunk := stream.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _some(items: Iterable[str], separator: str = ", ") -> str:
    items = list(items)
    shown = separator.join(items[:_MAX_PROBLEMS_SHOWN])
    return shown + (f" (and {len(items) - _MAX_PROBLEMS_SHOWN} more)" if len(items) > _MAX_PROBLEMS_SHOWN else "")
