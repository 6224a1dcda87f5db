"""A workload's own validation metrics (``Workload.metrics``): the exact mean over the whole validation set on
1 and 2 gloo ranks (uneven shards, a shard of padding only), in every place the loop's metrics go, and a bad
metric fails the run at the first validation with a message saying what to fix."""

from __future__ import annotations

import pytest
import torch

from orchestrator_contract.jobs import LOOP_EPOCH_METRICS
from tests.unit.harness import REGRESSION, job_config, model_state, run_on_ranks, train
from workers.workloads import load_workload

# 64 training samples; 31 validation samples: shards of 16 and 15, batches of 8 with a partial last one.
SHORT = {"epochs": 2, "lr": {"base": 0.05}, "checkpoint": {"every_epochs": 1}}
EPOCH_METRICS = {"train_loss", "val_loss", "val_mae", "val/within_0.5"}


def expected(run: dict, config: dict) -> dict[str, float]:
    """The metrics computed directly over the whole validation set by the final checkpoint's model."""
    workload = load_workload(REGRESSION)(config, 0)
    workload.model.load_state_dict(model_state(run["checkpoints"][-1]))
    x, y = (torch.stack(column) for column in zip(*workload.val_dataset, strict=True))
    with torch.no_grad():
        error = (workload.model(x) - y).abs()
    return {"val_mae": error.mean().item(), "val/within_0.5": (error < 0.5).double().mean().item()}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    work = tmp_path_factory.mktemp("metrics")
    tasks = [
        (train, {"config": job_config(REGRESSION, batch={"per_worker": 8}, **SHORT), "root": work / "2x8"}),
        # One validation sample: rank 1's shard is padding only, and it still sums the same names.
        (
            train,
            {
                "config": job_config(REGRESSION, batch={"per_worker": 8}, config={"val_samples": 1}, **SHORT),
                "root": work / "one-sample",
            },
        ),
    ]
    return run_on_ranks(tasks, work)


def test_workload_metrics_are_the_exact_mean_over_the_set_on_one_and_two_ranks(runs, tmp_path):
    two = runs[0][0]
    one = train(job_config(REGRESSION, workers=1, batch={"per_worker": 16}, **SHORT), tmp_path / "1x16")
    for run in (one, two):
        assert set(run["metrics"]) == EPOCH_METRICS | {"samples_per_s"}  # no val_accuracy: the workload's own
        truth = expected(run, {})
        for name, value in truth.items():
            assert run["metrics"][name] == pytest.approx(value, rel=1e-6, abs=1e-9), name
    assert two["metrics"]["val_mae"] == pytest.approx(one["metrics"]["val_mae"], rel=1e-5)
    assert two["metrics"]["val/within_0.5"] == one["metrics"]["val/within_0.5"]
    # Every rank computed the same epoch values (one all-reduce of the same names in the same order).
    assert runs[1][0]["metrics"] == {**two["metrics"], "samples_per_s": runs[1][0]["metrics"]["samples_per_s"]}


def test_workload_metrics_reach_the_epoch_events_and_the_checkpoints(runs):
    two = runs[0][0]
    epochs = [e for e in two["events"] if e["type"] == "metrics" and "val_loss" in e["values"]]
    assert [e["epoch"] for e in epochs] == [1, 2]
    assert all(set(e["values"]) == EPOCH_METRICS for e in epochs)
    assert [r["val_mae"] for r in two["reported"]] == [e["values"]["val_mae"] for e in epochs]  # keep_best, Tune
    # What a spec may name for such a workload, checked at submit (orchestrator_contract.jobs.epoch_metrics): the
    # loop's own epoch metrics and the workload's.
    assert all(set(r) == LOOP_EPOCH_METRICS | {"val_mae", "val/within_0.5", "epoch", "step"} for r in two["reported"])
    assert epochs[-1]["values"]["val_mae"] == two["metrics"]["val_mae"]  # the job's result


def test_a_shard_of_padding_only_counts_nothing(runs):
    for rank in (0, 1):
        run = runs[rank][1]
        assert run["metrics"]["val_mae"] == pytest.approx(expected(runs[0][1], {"val_samples": 1})["val_mae"], rel=1e-6)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"metric": "val mae"}, r"metric name 'val mae': .*\(no spaces or control characters\)"),
        ({"metric": "val_loss"}, "'val_loss' is a name the loop reports itself"),
        ({"metric": "x" * 65}, "is 65 characters: at most 64"),
        ({"per_sample": True}, r"'val_mae' has shape \(16, 1\): return one number, the mean over the batch's targets"),
    ],
)
def test_a_bad_workload_metric_fails_the_run_at_the_first_validation(tmp_path, config, message):
    with pytest.raises(ValueError, match=message):
        train(job_config(REGRESSION, workers=1, batch={"per_worker": 16}, config=config, **SHORT), tmp_path)
    assert not list(tmp_path.glob("**/model.pt"))  # not even the first epoch's checkpoint
