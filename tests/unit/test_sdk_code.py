"""``client.code.upload`` over the live app: a directory packed honouring .gitignore (nested ones too) and
.orchignore, .git/ always out, the same files giving the same package; an archive sent as it is."""

from __future__ import annotations

import io
import tarfile

import pytest

from orchestrator_client.packing import list_files, pack_directory
from tests.unit.sdk_helpers import sdk


def project_tree(root):
    files = {
        "train.py": "print('hi')\n",
        "pkg/__init__.py": "",
        "pkg/model.py": "X = 1\n",
        "pkg/secret.txt": "only pkg/.gitignore leaves this out\n",
        "secret.txt": "the root's secret.txt stays (pkg/.gitignore is for pkg/ only)\n",
        "pkg/.gitignore": "secret.txt\n",
        "data/big.bin": "x" * 1000,
        "run.log": "log\n",
        "keep.log": "kept by a negation\n",
        "cache/x.pyc": "",
        "notes.md": "left out by .orchignore\n",
        ".git/config": "[core]\n",
        ".gitignore": "data/\n*.log\n!keep.log\n*.pyc\n",
        ".orchignore": "notes.md\n",
    }
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


EXPECTED = [
    ".gitignore",
    ".orchignore",
    "keep.log",
    "pkg/.gitignore",
    "pkg/__init__.py",
    "pkg/model.py",
    "secret.txt",
    "train.py",
]


def test_upload_a_directory_honours_gitignore_and_orchignore(live, tmp_path):
    root = tmp_path / "project"
    project_tree(root)
    assert list_files(root) == EXPECTED
    client = sdk(live)
    uploaded = client.code.upload(root)
    assert uploaded.id.startswith("sha256:") and uploaded.files == len(EXPECTED)
    package = client.code.get(uploaded.id)
    assert sorted(f.path for f in package.file_list) == EXPECTED
    assert [p.id for p in client.code.list()] == [uploaded.id]
    # deterministic: packed again (new mtimes), the same bytes, the same package
    (root / "train.py").write_text("print('hi')\n")
    assert client.code.upload(str(root)).id == uploaded.id
    first, second = pack_directory(root), pack_directory(root)
    assert first.file.read() == second.file.read()
    # a job runs it by id
    job = client.jobs.submit({"workload": "train:main", "code": {"id": uploaded.id}})
    assert job.spec["code"]["id"] == uploaded.id


def test_an_archive_is_sent_as_it_is(live, tmp_path):
    archive = tmp_path / "code.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        data = b"print('hi')\n"
        info = tarfile.TarInfo("train.py")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    uploaded = sdk(live).code.upload(archive)
    assert uploaded.files == 1 and uploaded.size == archive.stat().st_size
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match=r"a directory, a \.zip or a \.tar\.gz"):
        sdk(live).code.upload(tmp_path / "notes.txt")


def test_an_empty_directory_is_refused_before_anything_is_sent(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / ".gitignore").write_text("*\n")
    with pytest.raises(ValueError, match="no files to pack"):
        pack_directory(tmp_path / "empty")


def test_a_link_inside_is_packed_as_its_file_and_a_link_out_of_the_directory_is_refused(tmp_path):
    root = tmp_path / "code"
    root.mkdir()
    (root / "train.py").write_text("print('hi')\n")
    (root / "alias.py").symlink_to(root / "train.py")
    assert list_files(root) == ["alias.py", "train.py"]
    secret = tmp_path / "credentials"
    secret.write_text("aws_secret_access_key = nope\n")
    (root / "creds").symlink_to(secret)
    with pytest.raises(ValueError, match="creds is a link to .*outside"):
        list_files(root)
    (root / ".orchignore").write_text("creds\n")  # left out: packs again
    assert list_files(root) == [".orchignore", "alias.py", "train.py"]
