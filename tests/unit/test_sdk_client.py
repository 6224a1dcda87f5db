"""The rest of the SDK over the live app: whoami, cluster, ready, plan, projects and keys; and spec loading
(files, overrides, the errors that say where)."""

from __future__ import annotations

import pytest

from orchestrator_client import Unauthenticated, ValidationFailed
from orchestrator_client.specs import SpecError, load_spec, parse_override
from orchestrator_contract.rest import PlanRequest
from tests.unit.sdk_helpers import sdk


def test_whoami_cluster_and_ready(live):
    client = sdk(live)
    admin = client.whoami()
    assert admin.cluster_admin and admin.role == "admin"
    project = client.projects.create("vision")
    member_key = client.projects.keys(project.id).create("member", name="ci")
    member = sdk(live, token=member_key.key)
    me = member.whoami()
    assert (me.key_id, me.key_name, me.role, me.project_id, me.cluster_admin) == (
        member_key.id,
        "ci",
        "member",
        project.id,
        False,
    )
    member.jobs.submit({"workload": "digits"})
    cluster = member.cluster()
    assert cluster.ray == "ok" and cluster.total["CPU"] == 4 and cluster.jobs.get("QUEUED") == 1
    assert [queued.id for queued in cluster.queue] and cluster.queue[0].reason is not None
    ready = client.ready()
    assert {k: ready[k] for k in ("ready", "database", "ray")} == {
        "ready": True,
        "database": "ok",
        "ray": "ok (4 CPU, 0 GPU)",
    }
    assert isinstance(ready["leader"], bool)
    live.backend.available = False
    ready = client.ready()  # /readyz answers 200 (the API serves), but ``ready`` still needs Ray
    assert ready["ready"] is False and ready["database"] == "ok" and ready["ray"].startswith("error")


def test_plan_from_a_dict_or_the_contracts_model(live):
    client = sdk(live)
    by_params = client.plan({"params": 1e9, "gpus": 8, "gpu_memory_gb": 80})
    assert by_params.params == 1e9 and by_params.recommended in by_params.strategies
    by_workload = client.plan(PlanRequest(workload="digits", gpu_memory_gb=16))
    assert by_workload.params > 0
    with pytest.raises(ValidationFailed) as error:
        client.plan({"params": 1e9})
    assert [tuple(e.loc) for e in error.value.field_errors] == [("body", "gpu_memory_gb")]


def test_projects_and_keys(live):
    client = sdk(live)
    project = client.projects.create("nlp", max_priority=10)
    assert client.projects.get(project.id).max_priority == 10
    assert client.projects.update(project.id, max_priority=None).max_priority is None
    assert "nlp" in [p.name for p in client.projects.list()]
    keys = client.projects.keys(project.id)
    made = keys.create("viewer", name="dashboard", expires_in_days=30)
    assert made.key and made.expires_at is not None
    assert made.id in [k.id for k in keys.list()]
    viewer = sdk(live, token=made.key)
    assert viewer.whoami().role == "viewer"
    keys.revoke(made.id)
    with pytest.raises(Unauthenticated):
        viewer.whoami()


def test_load_spec_files_and_overrides(tmp_path):
    path = tmp_path / "spec.yml"
    path.write_text("workload: digits\nscaling:\n  num_workers: 1\ncallbacks:\n  - {name: a}\n")
    spec = load_spec(
        path,
        [
            "epochs=3",
            "lr.base=1e-3",
            "scaling.num_workers=2",
            "labels.team=cv",
            "precision=bf16",
            "resume=true",
            "callbacks.0.name=b",
            "name=",
            "tags=[1, 2]",
        ],
    )
    assert spec["epochs"] == 3 and spec["lr"] == {"base": 1e-3} and spec["scaling"] == {"num_workers": 2}
    assert spec["labels"] == {"team": "cv"} and spec["precision"] == "bf16" and spec["resume"] is True
    assert spec["callbacks"] == [{"name": "b"}] and spec["name"] == "" and spec["tags"] == [1, 2]
    original = {"scaling": {"num_workers": 1}}
    assert load_spec(original, ["scaling.num_workers=4"])["scaling"]["num_workers"] == 4
    assert original == {"scaling": {"num_workers": 1}}  # the caller's dict is not changed
    assert parse_override("config.text_path=a=b.txt") == (["config", "text_path"], "a=b.txt")
    assert parse_override('name="1e3"') == (["name"], "1e3")  # quoted: a string, as YAML says


@pytest.mark.parametrize(
    ("text", "override", "message"),
    [
        ("workload: [digits\n", None, r"spec\.yaml:2:1: not YAML"),
        ("- a\n- b\n", None, "must be a mapping of fields, not list"),
        ("workload: digits\n", "epochs", "write key=value"),
        ("workload: digits\n", "workload.name=x", "workload is 'digits', not a mapping"),
        ("workload: digits\n", "a..b=1", "empty part"),
        ("callbacks: []\n", "callbacks.3.name=x", "'3' is not an index of a list of 0"),
    ],
)
def test_spec_errors_say_where(tmp_path, text, override, message):
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    with pytest.raises(SpecError, match=message):
        load_spec(path, [override] if override else [])


def test_spec_files_by_suffix(tmp_path):
    (tmp_path / "spec.json").write_text('{"workload": "digits",}')
    with pytest.raises(SpecError, match=r"spec\.json:1:\d+: not JSON"):
        load_spec(tmp_path / "spec.json")
    with pytest.raises(SpecError, match=r"\.yaml, \.yml or \.json"):
        load_spec(tmp_path / "spec.toml")
    with pytest.raises(SpecError, match="No such file"):
        load_spec(tmp_path / "missing.yaml")
