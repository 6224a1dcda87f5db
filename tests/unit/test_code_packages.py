"""POST/GET /v1/code: an upload is measured, checked, repacked as a zip and stored once per project."""

from __future__ import annotations

import hashlib
import io
import zipfile
from pathlib import Path

import pytest

from tests.unit.api_helpers import ADMIN, auth, make_project
from tests.unit.code_archives import TRAIN_PY, tar_files, zip_of


def upload(client, key: str, data: bytes, name: str = "code.zip", **params):
    return client.post("/v1/code", files={"file": (name, data)}, headers=auth(key), params=params)


def test_an_upload_answers_its_id_size_and_file_count_and_the_same_bytes_are_stored_once(client, app):
    project, keys = make_project(client, "team")
    data = zip_of({"train.py": TRAIN_PY, "lib/util.py": b"X = 1\n"})
    first = upload(client, keys["member"], data)
    assert first.status_code == 201, first.text
    digest = hashlib.sha256(data).hexdigest()
    assert first.json() == {"id": f"sha256:{digest}", "size": len(data), "files": 2}

    again = upload(client, keys["member"], data)
    assert again.status_code == 200 and again.json() == first.json()
    stored = Path(app.state.service.settings.storage_path) / "code" / project / f"{digest}.zip"
    assert sorted(p.name for p in stored.parent.iterdir()) == [stored.name]  # one file, no partial left

    with zipfile.ZipFile(stored) as archive:
        assert sorted(archive.namelist()) == ["lib/util.py", "train.py"]
        assert archive.read("train.py") == TRAIN_PY

    got = client.get(f"/v1/code/sha256:{digest}", headers=auth(keys["viewer"]))
    assert got.status_code == 200, got.text
    body = got.json()
    assert body["project_id"] == project and body["files"] == 2 and body["size"] == len(data)
    assert sorted((f["path"], f["size"]) for f in body["file_list"]) == [
        ("lib/util.py", 6),
        ("train.py", len(TRAIN_PY)),
    ]

    listed = client.get("/v1/code", headers=auth(keys["viewer"]))
    assert listed.status_code == 200
    assert [p["id"] for p in listed.json()] == [f"sha256:{digest}"] and listed.json()[0]["file_list"] is None


def test_a_tar_gz_of_a_folder_is_stored_as_a_zip_of_its_contents(client, app):
    project, keys = make_project(client, "team")
    data = tar_files({"mydir/train.py": TRAIN_PY, "mydir/data/rows.csv": b"1,2\n"})
    response = upload(client, keys["member"], data, name="code.tar.gz")
    assert response.status_code == 201, response.text
    digest = response.json()["id"].removeprefix("sha256:")
    stored = Path(app.state.service.settings.storage_path) / "code" / project / f"{digest}.zip"
    with zipfile.ZipFile(stored) as archive:
        assert sorted(archive.namelist()) == ["data/rows.csv", "train.py"]  # the one top folder dropped


def test_a_viewer_cannot_upload_and_lists_page(client):
    _, keys = make_project(client, "team")
    assert upload(client, keys["viewer"], zip_of({"a.py": b""})).status_code == 403
    for i in range(3):
        assert upload(client, keys["member"], zip_of({f"m{i}.py": b"x"})).status_code == 201
    first = client.get("/v1/code?limit=2", headers=auth(keys["member"]))
    assert len(first.json()) == 2 and "X-Next-Cursor" in first.headers
    second = client.get(f"/v1/code?limit=2&cursor={first.headers['X-Next-Cursor']}", headers=auth(keys["member"]))
    assert len(second.json()) == 1 and "X-Next-Cursor" not in second.headers


@pytest.mark.parametrize("package_id", ["sha256:" + "0" * 64, "nope", "sha256:XYZ"])
def test_an_unknown_package_is_404(client, package_id):
    _, keys = make_project(client, "team")
    assert client.get(f"/v1/code/{package_id}", headers=auth(keys["member"])).status_code == 404


def test_a_cluster_admin_uploads_into_a_project_it_names(client):
    project, keys = make_project(client, "team")
    data = zip_of({"train.py": TRAIN_PY})
    assert upload(client, ADMIN, data, project_id=project).status_code == 201
    package_id = f"sha256:{hashlib.sha256(data).hexdigest()}"
    assert client.get(f"/v1/code/{package_id}", headers=auth(keys["member"])).status_code == 200


def test_a_form_without_a_file_is_a_422(client):
    _, keys = make_project(client, "team")
    response = client.post("/v1/code", data={"file": "not a file"}, headers=auth(keys["member"]))
    assert response.status_code == 422 and response.json()["detail"][0]["loc"] == ["body", "file"]
    response = client.post(
        "/v1/code", content=b"{}", headers={**auth(keys["member"]), "Content-Type": "application/json"}
    )
    assert response.status_code == 422


def test_the_stored_zip_is_the_same_for_the_same_files(tmp_path):
    from orchestrator import code_archive

    limits = code_archive.Limits(max_files=10, max_unpacked_bytes=10**6)
    outputs = []
    for data in (zip_of({"a.py": b"1", "b/c.py": b"2"}), tar_files({"a.py": b"1", "b/c.py": b"2"})):
        source, out = io.BytesIO(data), io.BytesIO()
        kind, entries = code_archive.inspect(source, limits)
        code_archive.repack(source, kind, entries, out, limits)
        outputs.append(out.getvalue())
    assert outputs[0] == outputs[1]  # fixed dates and modes: Ray's package name follows the files alone
