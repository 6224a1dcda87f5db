"""The SDK's jobs against the unit-test app over real HTTP (``live``): submit from a dict, a YAML or JSON
file and overrides, idempotent retries, get by name prefix, wait, logs, metrics, checkpoints, cancel."""

from __future__ import annotations

import json
import threading
import time

import pytest

from orchestrator.backend import RunStatus
from orchestrator_client import Conflict, Job, NotFound, WaitTimeout
from orchestrator_contract.jobs import JobSpec
from tests.unit.api_helpers import reconcile
from tests.unit.sdk_helpers import checkpoint, metrics, report, running, sdk, start, state


@pytest.fixture
def settings_overrides() -> dict:
    return {"log_follow_poll_s": 0.05}


def test_submit_a_dict_a_spec_model_a_yaml_and_a_json_file_with_overrides(live, tmp_path):
    client = sdk(live)
    from_dict = client.jobs.submit({"workload": "digits", "name": "from-dict", "epochs": 2})
    assert isinstance(from_dict, Job) and from_dict.state == "QUEUED" and from_dict.spec["epochs"] == 2
    from_model = client.jobs.submit(JobSpec(workload="digits", name="from-model"))
    assert from_model.name == "from-model"

    (tmp_path / "spec.yaml").write_text("workload: digits\nname: from-yaml\nepochs: 5\nscaling:\n  num_workers: 1\n")
    job = client.jobs.submit(tmp_path / "spec.yaml", overrides=["epochs=3", "scaling.num_workers=2", "labels.team=cv"])
    assert (job.name, job.spec["epochs"], job.spec["scaling"]["num_workers"]) == ("from-yaml", 3, 2)
    assert job.labels == {"team": "cv"}

    (tmp_path / "spec.json").write_text(json.dumps({"workload": "digits", "name": "from-json"}))
    assert client.jobs.submit(str(tmp_path / "spec.json")).name == "from-json"
    # the file is read, not changed
    assert "epochs: 5" in (tmp_path / "spec.yaml").read_text()


def test_submit_sends_an_idempotency_key_so_a_retried_submit_gives_the_same_job(live):
    client = sdk(live)
    first = client.jobs.submit({"workload": "digits"}, idempotency_key="k-1")
    again = client.jobs.submit({"workload": "digits"}, idempotency_key="k-1")
    assert again.id == first.id
    # by default a fresh key per call: two calls are two jobs, each safe to retry on its own
    assert client.jobs.submit({"workload": "digits"}).id != client.jobs.submit({"workload": "digits"}).id
    with pytest.raises(Conflict):  # the same key with another spec
        client.jobs.submit({"workload": "digits", "epochs": 7}, idempotency_key="k-1")


def test_get_by_id_or_unique_name_prefix(live):
    client = sdk(live)
    alpha = client.jobs.submit({"workload": "digits", "name": "resnet-alpha"})
    client.jobs.submit({"workload": "digits", "name": "resnet-beta"})
    assert client.jobs.get(alpha.id).name == "resnet-alpha"
    assert client.jobs.get("resnet-a").id == alpha.id
    with pytest.raises(Conflict) as ambiguous:
        client.jobs.get("resnet")
    assert "resnet-alpha" in str(ambiguous.value) and "resnet-beta" in str(ambiguous.value)
    assert (
        len(ambiguous.value.candidates) == 2 and ambiguous.value.status_code is None
    )  # decided here, not by the server
    exact = client.jobs.submit({"workload": "digits", "name": "resnet"})
    assert client.jobs.get("resnet").id == exact.id  # a whole name wins over the names it is a prefix of
    with pytest.raises(NotFound, match="no job with id 'vgg'"):
        client.jobs.get("vgg")


def test_wait_returns_the_ended_job_and_reports_each_change(live):
    client = sdk(live)
    job = client.jobs.submit({"workload": "digits"})

    def driver() -> None:
        time.sleep(0.3)
        token = running(live, job.id)
        time.sleep(0.3)
        report(live, job.id, token, state("succeeded", result={"metrics": {"val_accuracy": 0.9}}))
        time.sleep(0.3)
        live.backend.runs[f"{job.id}-1"] = RunStatus.SUCCEEDED  # the driver exits
        reconcile(live.app)  # which confirms the reported end

    thread = threading.Thread(target=driver)
    thread.start()
    seen = []
    try:
        done = job.wait(timeout=20, poll=0.05, on_change=lambda j: seen.append(j.state.value))
    finally:
        thread.join()
    assert done is job and job.succeeded and job.done and job.result == {"metrics": {"val_accuracy": 0.9}}
    assert seen[0] == "QUEUED" and seen[-1] == "SUCCEEDED" and "RUNNING" in seen


def test_wait_past_its_timeout_raises_wait_timeout_with_the_last_state(live):
    job = sdk(live).jobs.submit({"workload": "digits"})
    started = time.monotonic()
    with pytest.raises(WaitTimeout) as timeout:
        job.wait(timeout=0.3, poll=0.1)
    assert time.monotonic() - started < 5
    assert timeout.value.last.state == "QUEUED" and "QUEUED" in str(timeout.value)
    assert timeout.value.status_code is None


@pytest.mark.timeout(60)
def test_logs_and_following_them_until_the_job_ends(live, monkeypatch):
    client = sdk(live)
    job = client.jobs.submit({"workload": "digits"})
    token = running(live, job.id)
    printed = ["epoch 1 of 2\n"]
    monkeypatch.setattr(live.backend, "logs", lambda submission_id: "".join(printed))
    assert list(job.logs()) == ["epoch 1 of 2"]

    def training() -> None:
        try:
            time.sleep(0.3)
            printed.append("epoch 2 of 2\n")
            time.sleep(0.3)
            printed.append("done\n")
        finally:  # the job ends whatever happens above: the follow below must end too
            report(live, job.id, token, state("succeeded"))
            live.backend.runs[f"{job.id}-1"] = RunStatus.SUCCEEDED  # the driver exits
            reconcile(live.app)  # which confirms the reported end

    thread = threading.Thread(target=training)
    thread.start()
    try:
        followed = list(job.logs(follow=True))
    finally:
        thread.join()
    assert followed == ["epoch 1 of 2", "epoch 2 of 2", "done"]
    assert list(job.logs(tail=1)) == ["done"]


def test_metrics_and_metrics_df(live):
    client = sdk(live)
    job = client.jobs.submit({"workload": "digits"})
    running(
        live,
        job.id,
        metrics(1, 10, train_loss=0.9, val_accuracy=0.7),
        metrics(2, 20, train_loss=0.5, val_accuracy=0.8),
        metrics(3, 30, train_loss=0.3),
    )
    points = list(job.metrics())
    assert [(p.epoch, p.step) for p in points] == [(1, 10), (2, 20), (3, 30)]
    frame = job.metrics_df()
    assert list(frame["step"]) == [10, 20, 30]
    assert list(frame["train_loss"]) == [0.9, 0.5, 0.3]
    assert frame["val_accuracy"].isna().tolist() == [False, False, True]
    assert {"attempt", "epoch", "created_at"} <= set(frame.columns)


def test_metrics_df_without_pandas_says_how_to_get_it(live, monkeypatch):
    import builtins

    job = sdk(live).jobs.submit({"workload": "digits"})
    real_import = builtins.__import__

    def no_pandas(name, *args, **kwargs):
        if name == "pandas":
            raise ImportError("No module named 'pandas'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pandas)
    with pytest.raises(ImportError, match=r"pip install 'orchestrator-client\[pandas\]'"):
        job.metrics_df()


def test_best_checkpoint_defaults_like_the_server(live):
    client = sdk(live)
    job = client.jobs.submit({"workload": "digits", "checkpoint": {"keep": 5}})
    running(
        live,
        job.id,
        checkpoint(live, job.id, 1, 10, val_accuracy=0.8, val_loss=0.5),
        checkpoint(live, job.id, 2, 20, val_accuracy=0.95, val_loss=0.4),
        checkpoint(live, job.id, 3, 30, val_accuracy=0.95, val_loss=0.6),
    )
    assert [c.epoch for c in job.checkpoints()] == [1, 2, 3]
    assert job.best_checkpoint().epoch == 3  # val_accuracy, max; a tie goes to the later
    assert job.best_checkpoint("val_loss").epoch == 2  # a loss: min by default
    assert job.best_checkpoint("val_loss", mode="max").epoch == 3
    assert job.best_checkpoint("samples_per_s") is None  # no checkpoint carries it
    with pytest.raises(ValueError, match="mode is required"):
        job.best_checkpoint("my_metric")

    kept = client.jobs.submit(
        {"workload": "digits", "checkpoint": {"keep_best": {"metric": "val_loss"}}}
    )  # the job's keep_best metric is the default
    token = start(live, kept.id)
    report(
        live,
        kept.id,
        token,
        checkpoint(live, kept.id, 1, 10, val_loss=0.2),
        checkpoint(live, kept.id, 2, 20, val_loss=0.3),
    )
    assert kept.best_checkpoint().epoch == 1


def test_cancel(live):
    client = sdk(live)
    job = client.jobs.submit({"workload": "digits"})
    assert job.cancel() is job and job.state == "CANCELLED" and job.done and not job.succeeded
    with pytest.raises(Conflict):
        job.cancel()
    assert client.jobs.get(job.id).state == "CANCELLED"


def test_logs_of_one_rank(live, monkeypatch):
    client = sdk(live)
    job = client.jobs.submit({"workload": "digits"})
    running(live, job.id)
    raw = (
        "driver starting\n"
        "(RayTrainWorker pid=11) [rank 0/2] training worker started (pid 11, host a)\n"
        "(RayTrainWorker pid=12) [rank 1/2] training worker started (pid 12, host a)\n"
        "\x1b[36m(RayTrainWorker pid=11)\x1b[0m loss 0.5\n"
        "(RayTrainWorker pid=12) loss 0.6\n"
    )
    monkeypatch.setattr(live.backend, "logs", lambda submission_id: raw)
    assert list(job.logs(rank=1)) == [
        "(RayTrainWorker pid=12) [rank 1/2] training worker started (pid 12, host a)",
        "(RayTrainWorker pid=12) loss 0.6",
    ]
    assert "(RayTrainWorker pid=11) loss 0.5" in list(job.logs())  # without its escape codes
    assert list(job.logs(rank=0, tail=1)) == ["(RayTrainWorker pid=11) loss 0.5"]
