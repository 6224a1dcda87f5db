"""``orch jobs`` against the unit-test app over real HTTP (fake cluster): every command, -o json/yaml with the
API's keys, plain tables off a terminal, a 422 pointing at the spec file's line, and the error exit codes."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.unit.cli_support import finish_run, orch, report, start

SPEC = """\
name: cli-digits
workload: digits
epochs: 3
scaling:
  num_workers: 1
labels:
  team: vision
"""


@pytest.fixture(autouse=True)
def _own_config(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    for name in ("ORCHESTRATOR_URL", "ORCHESTRATOR_TOKEN", "ORCHESTRATOR_PROFILE"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def spec_file(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC)
    return path


def _submit(live, spec_file, *extra) -> dict:
    result = orch(live, "jobs", "submit", "-f", str(spec_file), "-o", "json", *extra)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_submit_with_set_overrides_and_read_it_back_every_way(live, spec_file):
    job = _submit(live, spec_file, "--set", "epochs=2", "--set", "labels.run=a1", "--name", "cli-job")
    assert {"id", "state", "spec", "labels", "latest_metrics", "plan"} <= job.keys()  # the API's own keys
    assert job["spec"]["epochs"] == 2 and job["labels"] == {"team": "vision", "run": "a1"} and job["name"] == "cli-job"

    # get by id and by a unique name prefix; yaml parses to the same keys
    by_prefix = json.loads(orch(live, "jobs", "get", "cli-j", "-o", "json").stdout)
    assert by_prefix["id"] == job["id"]
    as_yaml = yaml.safe_load(orch(live, "jobs", "get", job["id"], "-o", "yaml").stdout)
    assert as_yaml["id"] == job["id"] and as_yaml.keys() == by_prefix.keys()

    # a table for people: no colour off a terminal, the id whole
    table = orch(live, "jobs", "get", job["id"])
    assert table.exit_code == 0 and job["id"] in table.stdout and "\x1b[" not in table.stdout
    listed = orch(live, "jobs", "list")
    assert job["id"] in listed.stdout and "QUEUED" in listed.stdout and "\x1b[" not in listed.stdout


def test_list_filters_by_state_label_and_name(live, spec_file):
    first = _submit(live, spec_file, "--name", "alpha-1")
    second = _submit(live, spec_file, "--name", "beta-1", "--set", "labels.team=nlp")
    orch(live, "jobs", "cancel", first["id"], "-y")

    def ids(*args):
        result = orch(live, "jobs", "list", "-o", "json", *args)
        assert result.exit_code == 0, result.output
        return [j["id"] for j in json.loads(result.stdout)]

    assert ids() == [second["id"], first["id"]]  # newest first
    assert ids("--state", "CANCELLED") == [first["id"]]
    assert ids("--state", "queued", "--state", "CANCELLED") == [second["id"], first["id"]]
    assert ids("-l", "team=nlp") == [second["id"]]
    assert ids("--name", "alpha") == [first["id"]]
    assert ids("--limit", "1") == [second["id"]]


def test_events_metrics_checkpoints_and_logs(live, spec_file, tmp_path):
    job_id = _submit(live, spec_file)["id"]
    token = start(live, job_id)
    ckpt = f"{live.app.state.service.settings.storage_path}/{job_id}/checkpoint_1"
    report(
        live,
        job_id,
        token,
        {"type": "state", "state": "running"},
        {"type": "metrics", "epoch": 1, "step": 10, "values": {"train_loss": 0.5, "val_accuracy": 0.9}},
        {
            "type": "checkpoint",
            "epoch": 1,
            "step": 10,
            "path": ckpt,
            "size_bytes": 2048,
            "metrics": {"val_accuracy": 0.9},
        },
    )
    events = json.loads(orch(live, "jobs", "events", job_id, "-o", "json").stdout)
    assert [(e["from_state"], e["to_state"]) for e in events] == [
        (None, "QUEUED"),
        ("QUEUED", "STARTING"),
        ("STARTING", "RUNNING"),
    ]
    assert "STARTING" in orch(live, "jobs", "events", job_id).stdout

    metrics = json.loads(orch(live, "jobs", "metrics", job_id, "-o", "json").stdout)
    assert metrics[0]["values"] == {"train_loss": 0.5, "val_accuracy": 0.9} and metrics[0]["step"] == 10
    assert "val_accuracy=0.9" in orch(live, "jobs", "metrics", job_id).stdout

    checkpoints = json.loads(orch(live, "jobs", "checkpoints", job_id, "-o", "json").stdout)
    assert [(c["path"], c["size_bytes"]) for c in checkpoints] == [(ckpt, 2048)]
    assert "2.0 KiB" in orch(live, "jobs", "checkpoints", job_id).stdout

    logs = orch(live, "jobs", "logs", job_id, "--tail", "5")
    assert logs.exit_code == 0 and logs.stdout == f"log of {job_id}-1\n"
    finish_run(live, job_id)
    followed = orch(live, "jobs", "logs", job_id, "-f")  # ends: the job ended and its Ray job too
    assert followed.exit_code == 0 and f"log of {job_id}-1" in followed.stdout


def test_a_bad_spec_file_shows_each_field_at_its_line_and_exits_2(live, tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("workload: digits\nepochs: 3\nscaling:\n  num_workers: 0\nbatch:\n  per_worker: -4\n")
    result = orch(live, "jobs", "submit", "-f", str(path))
    assert result.exit_code == 2, result.output
    assert f"{path}:4: scaling.num_workers:" in result.stderr
    assert f"{path}:6: batch.per_worker:" in result.stderr
    assert "request id" in result.stderr
    # JSON files too, and a field a --set gave points at the --set
    as_json = tmp_path / "bad.json"
    as_json.write_text('{\n  "workload": "digits",\n  "epochs": 0\n}\n')
    result = orch(live, "jobs", "submit", "-f", str(as_json), "--set", "scaling.num_workers=0")
    assert result.exit_code == 2
    assert f"{as_json}:3: epochs:" in result.stderr
    assert "--set scaling.num_workers=0: scaling.num_workers:" in result.stderr
    # a file that is not YAML: exit 2 with its line, nothing sent
    broken = tmp_path / "broken.yaml"
    broken.write_text("workload: digits\nscaling: [1,\n")
    result = orch(live, "jobs", "submit", "-f", str(broken))
    assert result.exit_code == 2 and f"{broken}:" in result.stderr
    assert json.loads(orch(live, "jobs", "list", "-o", "json").stdout) == []


def test_workdir_is_uploaded_and_named_in_the_spec(live, tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("def main(ctx):\n    pass\n")
    spec = tmp_path / "fn.yaml"
    spec.write_text("entrypoint: train:main\nepochs: 1\nscaling:\n  num_workers: 1\n")
    job = _submit(live, spec, "--workdir", str(code))
    assert job["spec"]["code"]["id"].startswith("sha256:")
    packages = json.loads(orch(live, "code", "list", "-o", "json").stdout)
    assert [p["id"] for p in packages] == [job["spec"]["code"]["id"]]


def test_cancel_asks_and_refuses_without_a_terminal(live, spec_file):
    job_id = _submit(live, spec_file)["id"]
    refused = orch(live, "jobs", "cancel", job_id)  # CliRunner's stdin is no terminal
    assert refused.exit_code == 2 and "-y" in refused.stderr
    assert json.loads(orch(live, "jobs", "get", job_id, "-o", "json").stdout)["state"] == "QUEUED"
    done = orch(live, "jobs", "cancel", job_id, "-y", "-o", "json")
    assert done.exit_code == 0 and json.loads(done.stdout)["state"] == "CANCELLED"
    again = orch(live, "jobs", "cancel", job_id, "-y")  # 409: already ended
    assert again.exit_code == 2 and "409" in again.stderr and "request id" in again.stderr


def test_wait_exits_with_the_jobs_result(live, spec_file):
    ok = _submit(live, spec_file)["id"]
    start(live, ok)
    finish_run(live, ok)
    result = orch(live, "jobs", "wait", ok, "--timeout", "5")
    assert result.exit_code == 0 and "SUCCEEDED" in result.stdout
    cancelled = _submit(live, spec_file)["id"]
    orch(live, "jobs", "cancel", cancelled, "-y")
    assert orch(live, "jobs", "wait", cancelled).exit_code == 3
    queued = _submit(live, spec_file)["id"]
    timed_out = orch(live, "jobs", "wait", queued, "--timeout", "0.2")
    assert timed_out.exit_code == 124 and "timed out" in timed_out.stderr


def test_errors_are_one_line_with_an_exit_code(live, spec_file):
    missing = orch(live, "jobs", "get", "no-such-job")
    assert missing.exit_code == 2 and missing.stderr.count("\n") == 1
    assert "404" in missing.stderr and "no-such-job" in missing.stderr and "request id" in missing.stderr
    bad_key = orch(live, "jobs", "list", token="not-a-key")
    assert bad_key.exit_code == 2 and "401" in bad_key.stderr
    _submit(live, spec_file, "--name", "twin-a")
    _submit(live, spec_file, "--name", "twin-b")
    ambiguous = orch(live, "jobs", "get", "twin")
    assert ambiguous.exit_code == 2 and "twin-a" in ambiguous.stderr and "twin-b" in ambiguous.stderr
    usage = orch(live, "jobs", "submit")  # no -f: typer's usage error
    assert usage.exit_code == 2


def test_no_service_says_which_url_and_how_to_set_it(tmp_path):
    from tests.conftest import free_port

    class Nowhere:
        url = f"http://127.0.0.1:{free_port()}"

    result = orch(Nowhere, "jobs", "list")
    assert result.exit_code == 1
    assert Nowhere.url in result.stderr and "--url" in result.stderr and "ORCHESTRATOR_URL" in result.stderr


def test_logs_of_one_rank(live, spec_file):
    job_id = _submit(live, spec_file)["id"]
    start(live, job_id)
    live.backend.logs = lambda submission_id: (
        "driver line\n"
        "(RayTrainWorker pid=11) [rank 0/2] training worker started (pid 11, host h)\n"
        "(RayTrainWorker pid=12) [rank 1/2] training worker started (pid 12, host h)\n"
        "(RayTrainWorker pid=11) epoch 1/3 step 5: train_loss 0.5\n"
        "(RayTrainWorker pid=12) rank one says hello\n"
    )
    rank_1 = orch(live, "jobs", "logs", job_id, "--rank", "1")
    assert rank_1.exit_code == 0, rank_1.output
    assert "rank one says hello" in rank_1.stdout and "epoch 1/3" not in rank_1.stdout
    assert "driver line" not in rank_1.stdout
    everything = orch(live, "jobs", "logs", job_id).stdout
    assert "driver line" in everything and "epoch 1/3" in everything
