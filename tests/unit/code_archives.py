"""Archives built in the tests (zipfile, tarfile), good and crafted bad ones, for the code package tests."""

from __future__ import annotations

import io
import stat
import struct
import tarfile
import zipfile
import zlib

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


def folders_tar_gz(count: int) -> bytes:
    """A .tar.gz of ``count`` folder entries (the same header again and again: ~450 bytes a thousand entries),
    built in a fraction of a second."""
    info = tarfile.TarInfo("folder/")
    info.type = tarfile.DIRTYPE
    info.mode = 0o755
    header = info.tobuf(format=tarfile.USTAR_FORMAT)
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    parts = [packer.compress(header * 1000) for _ in range(count // 1000)]
    parts += [packer.compress(header * (count % 1000) + bytes(1024)), packer.flush()]
    return b"".join(parts)


def folders_zip(count: int, declared: int | None = None) -> bytes:
    """A zip of ``count`` folder entries whose end record declares ``declared`` entries (a lie, when given)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for number in range(count):
            archive.writestr(zipfile.ZipInfo(f"d{number:05}/"), b"")
    data = bytearray(buffer.getvalue())
    if declared is not None:
        end = data.rfind(b"PK\x05\x06")
        data[end + 8 : end + 12] = struct.pack("<HH", declared, declared)  # entries on this disk, in all
    return bytes(data)
