"""``ORCHESTRATOR_CODE_STORAGE``: users' code packages kept apart from the checkpoint storage, where no Ray cluster
mounts them (docs/security.md, "Several clusters"): uploads land there, runs are handed them from there, garbage
collection deletes them there, and nothing of them is on the checkpoint storage the clusters read."""

from __future__ import annotations

import hashlib
from datetime import timedelta
from pathlib import Path

import pytest

from orchestrator.db.models import utcnow
from orchestrator.loops.code_gc import CodeCollector
from orchestrator.services.launch import ray_package_uri
from orchestrator.settings import Settings
from tests.unit.api_helpers import auth, make_project, tick
from tests.unit.code_archives import TRAIN_PY, zip_of


@pytest.fixture
def settings_overrides(tmp_path) -> dict:
    return {"code_storage": str(tmp_path / "control-plane-only")}


def test_packages_live_in_the_code_storage_only(app, client, backend, tmp_path):
    project, keys = make_project(client, "a")
    uploaded = client.post(
        "/v1/code", files={"file": ("c.zip", zip_of({"train_mnist.py": TRAIN_PY}))}, headers=auth(keys["member"])
    )
    assert uploaded.status_code == 201, uploaded.text
    code_id = uploaded.json()["id"]
    stored = tmp_path / "control-plane-only" / "code" / project / f"{code_id[7:]}.zip"
    assert stored.is_file()
    assert not (Path(app.state.service.settings.storage_path) / "code").exists()  # what the clusters mount

    spec = {"workload": "train_mnist:build", "epochs": 1, "code": {"id": code_id}, "scaling": {"num_workers": 1}}
    assert client.post("/v1/jobs", json=spec, headers=auth(keys["member"])).status_code == 201
    tick(app)
    uri = ray_package_uri(hashlib.sha256(stored.read_bytes()).hexdigest())
    assert backend.packages == {uri: stored.read_bytes()}  # handed to Ray from the code storage

    unused = client.post(
        "/v1/code", files={"file": ("o.zip", zip_of({"o.py": b"X = 1\n"}))}, headers=auth(keys["member"])
    )
    service = app.state.service
    collector = CodeCollector(service.sessions, service.code_storage, service.settings)
    assert collector.tick(utcnow() + timedelta(days=31)) == [unused.json()["id"]]
    assert not (stored.parent / f"{unused.json()['id'][7:]}.zip").exists() and stored.is_file()


def test_without_it_packages_stay_on_the_checkpoint_storage(tmp_path):
    assert Settings(storage=str(tmp_path / "s")).code_storage_path == str((tmp_path / "s").resolve())
    assert Settings(storage="s3://b/p").code_storage_path == "s3://b/p"
    assert Settings(storage="s3://b/p", code_storage="gs://c").code_storage_path == "gs://c"
