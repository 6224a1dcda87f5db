"""Hole 6, the rest (the body cap is in test_request_bodies_are_capped.py): distinct metric names per run,
a metric name's length, the size of a job's ``result`` and of a trial's reported config, and the number of
label filters in a query are capped; past a cap a 4xx names the bound, and on the drivers' routes nothing of
the batch is applied. ``latest_metrics`` can only hold capped names."""

from __future__ import annotations

import pytest

from tests.security.test_run_tokens_and_checkpoint_paths import post, started_job
from tests.unit.api_helpers import ADMIN, auth, tick
from tests.unit.test_sweeps import driver_token, post_sweep


@pytest.fixture
def settings_overrides() -> dict:
    return {"max_metric_names": 8, "max_metric_name_chars": 20, "max_result_kb": 4, "max_label_filters": 3}


def metrics(epoch: int, **values: float) -> dict:
    return {"type": "metrics", "epoch": epoch, "step": epoch, "values": values}


def job_of(client, job: str) -> dict:
    return client.get(f"/v1/jobs/{job}", headers=auth(ADMIN)).json()


def test_a_runs_distinct_metric_names_and_their_length_are_capped(app, client, backend):
    job, token = started_job(app, client, backend)
    assert post(client, job, token, metrics(1, **{f"m{i}": 1.0 for i in range(6)})).status_code == 200
    # 6 known + 3 new = 9 > 8: the batch is refused whole, the metric point before it in the batch too.
    over = post(client, job, token, metrics(2, loss=0.5), metrics(3, **{f"n{i}": 1.0 for i in range(3)}))
    assert over.status_code == 422, over.text
    assert "ORCHESTRATOR_MAX_METRIC_NAMES" in over.text and "8" in over.text
    assert "loss" not in job_of(client, job)["latest_metrics"]
    assert [p["epoch"] for p in client.get(f"/v1/jobs/{job}/metrics", headers=auth(ADMIN)).json()] == [1]
    # Known names may be reported again and again; two new ones still fit.
    assert post(client, job, token, metrics(2, m0=2.0, a=1.0, b=1.0)).status_code == 200
    assert len([k for k in job_of(client, job)["latest_metrics"] if k not in ("epoch", "step")]) == 8

    long_name = post(client, job, token, metrics(4, **{"x" * 21: 1.0}))
    assert long_name.status_code == 422 and "ORCHESTRATOR_MAX_METRIC_NAME_CHARS" in long_name.text
    checkpoint_metrics = post(
        client,
        job,
        token,
        {"type": "checkpoint", "epoch": 4, "step": 4, "path": "/nowhere", "size_bytes": 1, "metrics": {"y" * 21: 1.0}},
    )
    assert checkpoint_metrics.status_code == 422 and "ORCHESTRATOR_MAX_METRIC_NAME_CHARS" in checkpoint_metrics.text


@pytest.mark.parametrize("name", ["val\nmae", "val\x1b[31mmae", "val mae", "9lives"])
def test_a_reported_metric_name_with_control_characters_is_refused_naming_it(app, client, backend, name):
    job, token = started_job(app, client, backend)
    refused = post(client, job, token, metrics(1, val_loss=0.5), metrics(1, **{name: 1.0}))
    assert refused.status_code == 422, refused.text
    assert repr(name)[1:-1] in refused.json()["detail"] and f"job {job}" in refused.json()["detail"]
    assert job_of(client, job)["latest_metrics"] is None  # nothing of the batch applied
    checkpoint = {"type": "checkpoint", "epoch": 1, "step": 1, "path": "/nowhere", "size_bytes": 1}
    assert post(client, job, token, checkpoint | {"metrics": {name: 1.0}}).status_code == 422
    assert post(client, job, token, metrics(1, **{"val_mae": 1.0, "eval/top-5:acc": 0.5})).status_code == 200


def test_a_jobs_result_is_capped(app, client, backend):
    job, token = started_job(app, client, backend)
    assert post(client, job, token, {"type": "state", "state": "running"}).status_code == 200
    huge = {"type": "state", "state": "succeeded", "result": {"blob": "x" * 5000}}
    refused = post(client, job, token, huge)
    assert refused.status_code == 422 and "ORCHESTRATOR_MAX_RESULT_KB" in refused.text
    assert job_of(client, job)["state"] == "RUNNING" and job_of(client, job)["result"] is None
    assert post(client, job, token, {"type": "state", "state": "succeeded", "result": {"ok": 1}}).status_code == 200


def test_a_trials_config_and_metric_names_are_capped(app, client, backend):
    sweep = post_sweep(client).json()
    tick(app)
    headers = driver_token(client, backend, f"{sweep['id']}-1")

    def send(*events):
        return client.post(
            f"/internal/v1/sweeps/{sweep['id']}/events", json={"attempt": 1, "events": list(events)}, headers=headers
        )

    trial = {"type": "trial", "trial": "t_00000", "state": "running"}
    big = send(trial | {"config": {"lr.base": 0.1, "junk": "x" * 5000}})
    assert big.status_code == 422 and "ORCHESTRATOR_MAX_RESULT_KB" in big.text
    assert client.get(f"/v1/sweeps/{sweep['id']}/trials", headers=auth(ADMIN)).json() == []
    names = send(
        trial | {"config": {"lr.base": 0.1}, "epoch": 1, "step": 1, "metrics": {f"m{i}": 1.0 for i in range(9)}}
    )
    assert names.status_code == 422 and "ORCHESTRATOR_MAX_METRIC_NAMES" in names.text
    control = send(trial | {"config": {"lr.base": 0.1}, "epoch": 1, "step": 1, "metrics": {"mae\r": 1.0}})
    assert control.status_code == 422 and "'mae\\r'" in control.json()["detail"], control.text
    assert client.get(f"/v1/sweeps/{sweep['id']}/trials", headers=auth(ADMIN)).json() == []
    assert (
        send(trial | {"config": {"lr.base": 0.1}, "epoch": 1, "step": 1, "metrics": {"val_accuracy": 0.5}}).status_code
        == 200
    )


def test_the_label_filters_of_a_query_are_capped(client):
    three = [("label", f"k{i}=v") for i in range(3)]
    assert client.get("/v1/jobs", params=three, headers=auth(ADMIN)).status_code == 200
    four = client.get("/v1/jobs", params=three + [("label", "k9=v")], headers=auth(ADMIN))
    assert four.status_code == 422 and "ORCHESTRATOR_MAX_LABEL_FILTERS" in four.text and "3" in four.text
