"""``orch projects``, ``orch keys``, ``orch code`` and ``orch plan`` against the unit-test app over real HTTP."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.unit.cli_support import orch


@pytest.fixture(autouse=True)
def _own_config(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))


def test_projects_and_keys(live):
    created = orch(live, "projects", "create", "nlp", "--max-priority", "10", "-o", "json")
    assert created.exit_code == 0, created.output
    project = json.loads(created.stdout)
    assert {"id", "name", "created_at", "max_priority"} <= project.keys() and project["max_priority"] == 10
    assert "nlp" in orch(live, "projects", "list").stdout
    assert json.loads(orch(live, "projects", "get", "nlp", "-o", "json").stdout)["id"] == project["id"]
    updated = orch(live, "projects", "update", project["id"], "--max-priority", "5", "-o", "yaml")
    assert yaml.safe_load(updated.stdout)["max_priority"] == 5
    assert orch(live, "projects", "create", "nlp").exit_code == 2  # 409: the name is taken

    key = json.loads(orch(live, "keys", "create", "-p", "nlp", "--role", "viewer", "--name", "ro", "-o", "json").stdout)
    assert key["role"] == "viewer" and key["key"]
    listed = json.loads(orch(live, "keys", "list", "-p", "nlp", "-o", "json").stdout)
    assert [k["id"] for k in listed] == [key["id"]] and "key" not in listed[0]
    assert "ro" in orch(live, "keys", "list", "-p", project["id"]).stdout
    # a viewer may read, not create projects: 403 is exit 2
    denied = orch(live, "projects", "create", "other", token=key["key"])
    assert denied.exit_code == 2 and "403" in denied.stderr
    assert orch(live, "keys", "revoke", key["id"], "-p", "nlp").exit_code == 2  # no terminal: -y needed
    assert orch(live, "keys", "revoke", key["id"], "-p", "nlp", "-y").exit_code == 0
    assert orch(live, "projects", "list", token=key["key"]).exit_code == 2  # revoked: 401


def test_project_quota(live):
    """``orch projects quota`` and the SDK's ``set_quota`` (docs/scheduling.md, "Quotas"): PUT replaces the whole
    quota."""
    assert orch(live, "projects", "create", "vision").exit_code == 0
    set_ = orch(
        live, "projects", "quota", "vision", "--max-gpus", "8", "--max-queued", "20", "--no-borrowing", "-o", "json"
    )
    assert set_.exit_code == 0, set_.output
    assert json.loads(set_.stdout) == {
        "max_cpus": None,
        "max_gpus": 8.0,
        "max_running_jobs": None,
        "max_queued": 20,
        "weight": 1.0,
        "borrowing": False,
        "per_cluster": {},
    }
    shown = json.loads(orch(live, "projects", "get", "vision", "-o", "json").stdout)
    assert shown["quota"]["max_gpus"] == 8.0 and shown["quota"]["borrowing"] is False
    bad = orch(live, "projects", "quota", "vision", "--weight", "0")
    assert bad.exit_code == 2 and "weight" in bad.output
    capped = orch(
        live, "projects", "quota", "vision", "--per-cluster", "local:max_cpus=2,max_running_jobs=1", "-o", "json"
    )
    assert capped.exit_code == 0, capped.output
    assert json.loads(capped.stdout)["per_cluster"] == {
        "local": {"max_cpus": 2.0, "max_gpus": None, "max_running_jobs": 1}
    }
    for wrong in ("local", "local:max_cpus", "local:cpus=2", "local:max_cpus=two", ":max_cpus=2"):
        refused = orch(live, "projects", "quota", "vision", "--per-cluster", wrong)
        assert refused.exit_code == 2 and "CLUSTER:LIMIT=N" in refused.output, (wrong, refused.output)
    unknown = orch(live, "projects", "quota", "vision", "--per-cluster", "nowhere:max_cpus=1")
    assert unknown.exit_code != 0 and "nowhere" in unknown.output, unknown.output


def test_code_upload_list_get(live, tmp_path):
    code = tmp_path / "code"
    (code / "pkg").mkdir(parents=True)
    (code / "pkg" / "model.py").write_text("x = 1\n")
    (code / "notes.log").write_text("left out\n")
    (code / ".orchignore").write_text("*.log\n")
    uploaded = json.loads(orch(live, "code", "upload", str(code), "-o", "json").stdout)
    assert uploaded["id"].startswith("sha256:") and {"size", "files"} <= uploaded.keys()
    package = json.loads(orch(live, "code", "get", uploaded["id"], "-o", "json").stdout)
    paths = {f["path"] for f in package["file_list"]}
    assert "pkg/model.py" in paths and "notes.log" not in paths
    assert "pkg/model.py" in orch(live, "code", "get", uploaded["id"]).stdout
    assert uploaded["id"] in orch(live, "code", "list").stdout
    assert orch(live, "code", "upload", str(tmp_path / "missing")).exit_code == 2


def test_plan(live, tmp_path):
    request = tmp_path / "plan.yaml"
    request.write_text("params: 7.0e9\ngpus: 8\ngpu_memory_gb: 80\nper_gpu_batch: 4\n")
    answer = orch(live, "plan", "-f", str(request), "-o", "json")
    assert answer.exit_code == 0, answer.output
    body = json.loads(answer.stdout)
    assert {"strategies", "recommended", "global_batch", "lr"} <= body.keys() and body["global_batch"] == 32
    table = orch(live, "plan", "-f", str(request), "--set", "gpus=1")
    assert "recommended" in table.stdout and "STRATEGY" in table.stdout
    bad = orch(live, "plan", "-f", str(request), "--set", "gpu_memory_gb=-1")
    assert bad.exit_code == 2 and "--set gpu_memory_gb=-1: gpu_memory_gb" in bad.stderr


def test_code_upload_of_a_directory_with_a_link_out_of_it_is_a_usage_error(live, tmp_path):
    root = tmp_path / "code"
    root.mkdir()
    (root / "train.py").write_text("print('hi')\n")
    (tmp_path / "secret").write_text("nope\n")
    (root / "creds").symlink_to(tmp_path / "secret")
    result = orch(live, "code", "upload", str(root))
    assert result.exit_code == 2 and "creds is a link to" in result.output and "Traceback" not in result.output
