"""A job's or a sweep's own code: the spec's ``code``, the submit checks, what Ray is handed (the stored zip
in Ray's package store as working_dir, pip requirements), last use, and garbage collection."""

from __future__ import annotations

import hashlib
from datetime import timedelta
from pathlib import Path

import pytest
from pydantic import ValidationError

from orchestrator.backend import RunStatus
from orchestrator.code_storage import CodeStorage
from orchestrator.db.models import CodePackage, utcnow
from orchestrator.loops.code_gc import CodeCollector
from orchestrator.services.launch import ray_package_uri
from orchestrator_contract.code import CodeSpec
from tests.unit.api_helpers import auth, make_project, reconcile, tick
from tests.unit.code_archives import TRAIN_PY, zip_of

DIGEST = "0" * 64
SWEEP_SPACE = {"lr.base": {"type": "loguniform", "low": 1e-3, "high": 0.3}}


def upload(client, key: str, files: dict[str, bytes]) -> str:
    response = client.post("/v1/code", files={"file": ("code.zip", zip_of(files))}, headers=auth(key))
    assert response.status_code in (200, 201), response.text
    return response.json()["id"]


def job_with_code(code_id: str, **code) -> dict:
    return {"workload": "train_mnist:build", "epochs": 1, "code": {"id": code_id, **code}}


# --- the spec -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("requirement", ["scipy==1.14.1", "numpy>=2,<3", "requests[socks]~=2.32", "tqdm", "a.b-c_d"])
def test_plain_requirements_are_accepted(requirement):
    assert CodeSpec(id=f"sha256:{DIGEST}", requirements=[requirement]).requirements == [requirement]


@pytest.mark.parametrize(
    "requirement",
    [
        "--index-url https://evil.example/simple",
        "-e .",
        "-r other.txt",
        "git+https://github.com/x/y",
        "pkg @ https://evil.example/pkg.whl",
        "./local/pkg",
        "/abs/pkg.whl",
        "pkg; python_version > '3'",
        "pkg==1.0 --hash=sha256:abc",
        "",
        "x" * 201,
    ],
)
def test_options_paths_urls_and_markers_are_refused(requirement):
    with pytest.raises(ValidationError):
        CodeSpec(id=f"sha256:{DIGEST}", requirements=[requirement])


def test_the_code_id_and_the_number_of_requirements_are_checked():
    for bad in ("sha256:xyz", DIGEST, f"md5:{DIGEST[:32]}"):
        with pytest.raises(ValidationError):
            CodeSpec(id=bad)
    with pytest.raises(ValidationError):
        CodeSpec(id=f"sha256:{DIGEST}", requirements=["tqdm"] * 65)


# --- submitting ----------------------------------------------------------------------------------------


def test_a_job_names_a_package_of_its_own_project_only(client):
    _, a = make_project(client, "a")
    _, b = make_project(client, "b")
    code_id = upload(client, a["member"], {"train_mnist.py": TRAIN_PY})
    assert client.post("/v1/jobs", json=job_with_code(code_id), headers=auth(a["member"])).status_code == 201
    refused = client.post("/v1/jobs", json=job_with_code(code_id), headers=auth(b["member"]))
    assert refused.status_code == 422, refused.text
    assert refused.json()["detail"][0]["loc"] == ["body", "code", "id"]


def test_module_function_from_the_code_is_accepted_only_with_code(client):
    _, keys = make_project(client, "a")
    refused = client.post("/v1/jobs", json={"workload": "train_mnist:build"}, headers=auth(keys["member"]))
    assert refused.status_code == 422 and "not an allowed workload package" in refused.text


def test_requirements_are_refused_when_the_operator_turns_them_off(client, app):
    _, keys = make_project(client, "a")
    code_id = upload(client, keys["member"], {"train_mnist.py": TRAIN_PY})
    spec = job_with_code(code_id, requirements=["scipy==1.14.1"])
    app.state.service.settings.allow_requirements = False
    refused = client.post("/v1/jobs", json=spec, headers=auth(keys["member"]))
    assert refused.status_code == 422 and refused.json()["detail"][0]["loc"] == ["body", "code", "requirements"]
    assert "ORCHESTRATOR_ALLOW_REQUIREMENTS" in refused.text
    app.state.service.settings.allow_requirements = True
    assert client.post("/v1/jobs", json=spec, headers=auth(keys["member"])).status_code == 201


def test_a_sweep_inherits_its_base_jobs_code_and_cannot_search_over_it(client):
    _, keys = make_project(client, "a")
    code_id = upload(client, keys["member"], {"train_mnist.py": TRAIN_PY})
    base = {**job_with_code(code_id), "scaling": {"num_workers": 1}}
    sweep = {"base": base, "search_space": SWEEP_SPACE, "num_samples": 2}
    created = client.post("/v1/sweeps", json=sweep, headers=auth(keys["member"]))
    assert created.status_code == 201, created.text
    missing = {**sweep, "base": {**base, "code": {"id": f"sha256:{DIGEST}"}}}
    refused = client.post("/v1/sweeps", json=missing, headers=auth(keys["member"]))
    assert refused.status_code == 422 and refused.json()["detail"][0]["loc"] == ["body", "base", "code", "id"]
    searched = {**sweep, "search_space": {"code.id": {"type": "choice", "values": [code_id]}}}
    assert client.post("/v1/sweeps", json=searched, headers=auth(keys["member"])).status_code == 422


# --- what Ray is handed ----------------------------------------------------------------------------


def test_the_stored_zip_goes_to_rays_package_store_once_and_is_the_working_dir(client, app, backend):
    project, keys = make_project(client, "a")
    code_id = upload(client, keys["member"], {"train_mnist.py": TRAIN_PY})
    for _ in range(2):
        spec = {**job_with_code(code_id, requirements=["scipy==1.14.1"]), "scaling": {"num_workers": 1}}
        assert client.post("/v1/jobs", json=spec, headers=auth(keys["member"])).status_code == 201
    before = utcnow()
    tick(app)

    stored = Path(app.state.service.settings.storage_path) / "code" / project / f"{code_id[7:]}.zip"
    uri = ray_package_uri(hashlib.sha256(stored.read_bytes()).hexdigest())
    assert backend.packages == {uri: stored.read_bytes()}  # uploaded once, from storage, for both jobs
    assert [env["working_dir"] for env in backend.runtime_envs] == [uri, uri]
    assert all(env["pip"] == ["scipy==1.14.1"] for env in backend.runtime_envs)
    with app.state.service.sessions() as session:
        package = session.query(CodePackage).one()
        assert package.last_used_at >= before


def test_a_job_without_code_gets_no_working_dir(client, app, backend):
    _, keys = make_project(client, "a")
    spec = {"workload": "digits", "epochs": 1, "scaling": {"num_workers": 1}}
    assert client.post("/v1/jobs", json=spec, headers=auth(keys["member"])).status_code == 201
    tick(app)
    assert [set(env) for env in backend.runtime_envs] == [{"env_vars"}] and backend.packages == {}


# --- garbage collection -----------------------------------------------------------------------------


def test_unused_packages_no_run_names_are_collected_after_the_retention(client, app):
    project, keys = make_project(client, "a")
    named = upload(client, keys["member"], {"train_mnist.py": TRAIN_PY})
    unnamed = upload(client, keys["member"], {"other.py": b"X = 1\n"})
    assert client.post("/v1/jobs", json=job_with_code(named), headers=auth(keys["member"])).status_code == 201
    service = app.state.service
    collector = CodeCollector(service.sessions, service.code_storage, service.settings)
    storage = CodeStorage(service.settings.storage_path)

    assert collector.tick(utcnow() + timedelta(days=29)) == []  # not old enough
    assert collector.tick(utcnow() + timedelta(days=31)) == [unnamed]  # the named one stays
    assert not storage.exists(project, unnamed[7:]) and storage.exists(project, named[7:])
    assert client.get(f"/v1/code/{unnamed}", headers=auth(keys["member"])).status_code == 404
    assert client.get(f"/v1/code/{named}", headers=auth(keys["member"])).status_code == 200
    # Uploaded again, it is stored again (201) and its clock starts over.
    response = client.post(
        "/v1/code", files={"file": ("c.zip", zip_of({"other.py": b"X = 1\n"}))}, headers=auth(keys["member"])
    )
    assert response.status_code == 201 and response.json()["id"] == unnamed
    assert collector.tick(utcnow() + timedelta(days=29)) == []


def test_uploading_the_same_bytes_again_counts_as_a_use(client, app):
    _, keys = make_project(client, "a")
    files = {"train_mnist.py": TRAIN_PY}
    code_id = upload(client, keys["member"], files)
    service = app.state.service
    with service.sessions.begin() as session:
        session.query(CodePackage).one().last_used_at = utcnow() - timedelta(days=40)
    upload(client, keys["member"], files)  # 200: the same bytes
    collector = CodeCollector(service.sessions, service.code_storage, service.settings)
    assert collector.tick() == []
    assert client.get(f"/v1/code/{code_id}", headers=auth(keys["member"])).status_code == 200


# --- a package gone while a run waits for it (deleted by hand) -----------------------------------------


def _queued_job_with_code(client) -> tuple[str, str, str, str]:
    project, keys = make_project(client, "a")
    code_id = upload(client, keys["member"], {"train_mnist.py": TRAIN_PY})
    spec = {**job_with_code(code_id), "scaling": {"num_workers": 1}}
    response = client.post("/v1/jobs", json=spec, headers=auth(keys["member"]))
    assert response.status_code == 201, response.text
    return project, keys["member"], code_id, response.json()["id"]


def _job(client, key: str, job_id: str) -> dict:
    return client.get(f"/v1/jobs/{job_id}", headers=auth(key)).json()


def test_a_queued_run_whose_package_row_was_deleted_fails_with_code_missing(client, app, backend):
    _, key, code_id, job_id = _queued_job_with_code(client)
    with app.state.service.sessions.begin() as session:
        session.query(CodePackage).delete()
    tick(app)
    job = _job(client, key, job_id)
    assert (job["state"], job["reason"]) == ("FAILED", "code_missing"), job
    assert code_id in job["message"] and "upload it again" in job["message"]
    tick(app)  # nothing is tried again
    assert backend.submitted == [] and backend.packages == {}


def test_a_queued_run_whose_stored_package_was_deleted_fails_with_code_missing(client, app, backend):
    project, key, code_id, job_id = _queued_job_with_code(client)
    CodeStorage(app.state.service.settings.storage_path).delete(project, code_id[7:])
    tick(app)
    job = _job(client, key, job_id)
    assert (job["state"], job["reason"]) == ("FAILED", "code_missing"), job
    assert code_id in job["message"] and "Ray has no copy" in job["message"]
    assert backend.submitted == []
    reconcile(app)  # a FAILED run is not resubmitted
    assert backend.submitted == []


def test_a_new_attempt_whose_package_is_gone_fails_with_code_missing(client, app, backend):
    _, key, code_id, job_id = _queued_job_with_code(client)
    tick(app)
    assert [s[0] for s in backend.submitted] == [f"{job_id}-1"]
    with app.state.service.sessions.begin() as session:
        session.query(CodePackage).delete()
    backend.runs[f"{job_id}-1"] = RunStatus.FAILED  # the driver died: the reconciler starts attempt 2
    reconcile(app)
    job = _job(client, key, job_id)
    assert (job["state"], job["reason"], job["attempt"]) == ("FAILED", "code_missing", 2), job
    assert code_id in job["message"]
    assert [s[0] for s in backend.submitted] == [f"{job_id}-1"]
