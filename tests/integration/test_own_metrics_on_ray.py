"""A workload's own metric end to end (docs/code.md): examples/own_code/regression, a directory no node has
installed, uploaded with POST /v1/code, swept as its sweep.json says (ASHA on its own `val_mae`, mode min,
2-worker DDP trials), and trained as a job that keeps its best checkpoint by `val_mae`."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import pytest

from tests.integration.test_sweeps_on_ray import _trials, _trials_dir, _wait, _wait_no_train_workers
from tests.trial_checkpoints import assert_trial_checkpoints_agree

pytestmark = pytest.mark.integration

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "own_code" / "regression"
# What each epoch of the example reports: the loop's losses and throughput, the workload's val_mae; no
# val_accuracy (the workload has metrics of its own) and nothing Tune adds.
EPOCH_METRICS = {"train_loss", "val_loss", "val_mae", "samples_per_s"}


def _package() -> bytes:
    """The example's directory, zipped with its folder as `zip -r regression.zip regression` does."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for path in sorted(EXAMPLE.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                archive.write(path, f"regression/{path.relative_to(EXAMPLE).as_posix()}")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def code_id(member) -> str:
    uploaded = member.http.post("/v1/code", files={"file": ("regression.zip", _package())})
    assert uploaded.status_code in (200, 201), uploaded.text
    return uploaded.json()["id"]


def test_a_sweep_of_uploaded_code_is_scheduled_and_judged_by_its_own_metric(member, ray_cluster, code_id):
    spec = json.loads((EXAMPLE / "sweep.json").read_text())
    spec["base"]["code"]["id"] = code_id
    best_lr, *slower = spec["search_space"]["lr.base"]["values"]  # 0.03 learns the most in an epoch
    response = member.http.post("/v1/sweeps", json=spec)
    assert response.status_code == 201, response.text
    assert (response.json()["metric"], response.json()["mode"]) == ("val_mae", "min")
    sweep = _wait(member, response.json()["id"])
    trials = _trials(member, sweep["id"])
    assert len(trials) == 3

    # Every epoch of every trial carries val_mae, and the best epoch of each is its lowest val_mae.
    points = {t["id"]: member.http.get(f"/v1/trials/{t['id']}/metrics").json() for t in trials}
    for trial in trials:
        assert [p["epoch"] for p in points[trial["id"]]] == list(range(1, trial["iterations"] + 1))
        assert all(set(p["values"]) == EPOCH_METRICS for p in points[trial["id"]]), points[trial["id"]]
        assert trial["best_metric"] == min(p["values"]["val_mae"] for p in points[trial["id"]])
    # ASHA, minimising val_mae, one trial at a time in grid order: the two smaller rates reach the first rung
    # after 0.03 with a higher val_mae, and are stopped there; 0.03 runs to the end. (Maximising, ASHA
    # would have let them run and the best trial would be the worst.)
    by_lr = {t["config"]["lr.base"]: t for t in trials}
    for lr in slower:
        assert by_lr[lr]["state"] == "STOPPED" and by_lr[lr]["stopped_early"], by_lr[lr]
        assert 1 <= by_lr[lr]["iterations"] < 4, by_lr[lr]
    finished = by_lr[best_lr]
    assert (finished["state"], finished["iterations"], finished["stopped_early"]) == ("SUCCEEDED", 4, False)
    assert sweep["trials"]["STOPPED"] == 2 and sweep["trials"]["SUCCEEDED"] == 1
    # The best trial is the one with the lowest val_mae.
    best = min(trials, key=lambda t: t["best_metric"])
    assert best["id"] == finished["id"] and best["best_metric"] < min(by_lr[lr]["best_metric"] for lr in slower)
    assert sweep["best_trial"]["id"] == best["id"] and sweep["best_trial"]["metric"] == best["best_metric"]
    _wait_no_train_workers(ray_cluster)
    assert_trial_checkpoints_agree(member.http, sweep["id"], _trials_dir(sweep))


def test_a_job_of_uploaded_code_keeps_its_best_checkpoint_by_its_own_metric(member, code_id):
    spec = json.loads((EXAMPLE / "sweep.json").read_text())["base"]
    spec["code"]["id"] = code_id
    keep_best = {"metric": "val_mae", "mode": "min", "count": 1}
    response = member.submit(
        **{**spec, "epochs": 2, "lr": {"base": 0.03}, "checkpoint": {"keep": 1, "keep_best": keep_best}}
    )
    assert response.status_code == 201, response.text
    job = member.wait(response.json()["id"], {"SUCCEEDED"}, timeout_s=300)
    assert set(job["result"]["metrics"]) >= EPOCH_METRICS and "val_accuracy" not in job["result"]["metrics"]

    epochs = [p for p in member.http.get(f"/v1/jobs/{job['id']}/metrics").json() if "val_loss" in p["values"]]
    assert [p["epoch"] for p in epochs] == [1, 2], epochs
    # An epoch's point (merged with the step metrics of the same step) has the workload's metric, not accuracy.
    assert all("val_mae" in p["values"] and "val_accuracy" not in p["values"] for p in epochs), epochs
    assert job["result"]["metrics"]["val_mae"] == epochs[-1]["values"]["val_mae"]
    # Kept: the latest (keep 1) and the lowest val_mae (retention ran before the job was reported finished).
    best_epoch = min(epochs, key=lambda p: (p["values"]["val_mae"], -p["epoch"]))["epoch"]
    recorded = member.http.get(f"/v1/jobs/{job['id']}/checkpoints").json()
    assert sorted(c["epoch"] for c in recorded) == sorted({best_epoch, 2})
    assert all(c["metrics"]["val_mae"] == epochs[c["epoch"] - 1]["values"]["val_mae"] for c in recorded)
