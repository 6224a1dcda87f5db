"""Archives built in the tests (zipfile, tarfile), good and crafted bad ones, for the code package tests."""

from __future__ import annotations

import io
import stat
import tarfile
import zipfile

TRAIN_PY = b"def build(config, seed):\n    raise NotImplementedError\n"


def zip_of(files: dict[str, bytes], modes: dict[str, int] | None = None) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            info = zipfile.ZipInfo(name)
            info.compress_type = zipfile.ZIP_DEFLATED
            if modes and name in modes:
                info.external_attr = modes[name] << 16
            archive.writestr(info, data)
    return buffer.getvalue()


def tar_of(members: list[tuple[str, bytes | None, bytes]]) -> bytes:
    """(name, data or None, tar type) for each member; data None for a link, device or FIFO."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, data, kind in members:
            info = tarfile.TarInfo(name)
            info.type = kind
            if kind in (tarfile.SYMTYPE, tarfile.LNKTYPE):
                info.linkname = "train.py"
            if data is not None:
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
            else:
                archive.addfile(info)
    return buffer.getvalue()


def tar_files(files: dict[str, bytes]) -> bytes:
    return tar_of([(name, data, tarfile.REGTYPE) for name, data in files.items()])


# Each crafted bad archive, and a part of the entry's name the 422 must carry.
BAD_ARCHIVES: dict[str, tuple[bytes, str]] = {
    "zip_absolute": (zip_of({"/etc/cron.d/evil": b"x"}), "/etc/cron.d/evil"),
    "zip_dotdot": (zip_of({"code/../../evil.py": b"x"}), "../../evil.py"),
    "zip_symlink": (zip_of({"link": b"/etc/passwd"}, {"link": stat.S_IFLNK | 0o777}), "link"),
    "zip_fifo": (zip_of({"pipe": b""}, {"pipe": stat.S_IFIFO | 0o644}), "pipe"),
    "tar_absolute": (tar_files({"/tmp/evil.py": b"x"}), "/tmp/evil.py"),
    "tar_dotdot": (tar_files({"../evil.py": b"x"}), "../evil.py"),
    "tar_symlink": (tar_of([("link", None, tarfile.SYMTYPE)]), "link"),
    "tar_hardlink": (tar_of([("hard", None, tarfile.LNKTYPE)]), "hard"),
    "tar_chardev": (tar_of([("zero", None, tarfile.CHRTYPE)]), "zero"),
    "tar_blockdev": (tar_of([("disk", None, tarfile.BLKTYPE)]), "disk"),
    "tar_fifo": (tar_of([("fifo", None, tarfile.FIFOTYPE)]), "fifo"),
}


def zip_bomb(unpacked_mb: int) -> bytes:
    """A small zip that unpacks to ``unpacked_mb`` MB of zeros (deflate packs them ~1000:1)."""
    return zip_of({"zeros.bin": bytes(unpacked_mb * 1024 * 1024)})
