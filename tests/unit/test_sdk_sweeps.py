"""Sweeps and trials through the SDK over the live app: submit, get by name prefix, trials, the best trial,
trial metrics as a DataFrame, wait, logs, cancel."""

from __future__ import annotations

import httpx
import pytest

from orchestrator_client import Conflict, Sweep, Trial, WaitTimeout
from tests.unit.api_helpers import run_token_at, tick
from tests.unit.sdk_helpers import sdk

SPEC = {
    "name": "lr-search",
    "base": {"workload": "digits", "epochs": 4, "scaling": {"num_workers": 2, "cpus_per_worker": 0.5}},
    "search_space": {"lr.base": {"type": "loguniform", "low": 1e-3, "high": 0.3}},
    "metric": "val_loss",
}


def drive(live, sweep_id: str, *events: dict) -> None:
    """What the sweep's driver reports."""
    token = run_token_at(live.url, live.backend, f"{sweep_id}-1")
    response = httpx.post(
        f"{live.url}/internal/v1/sweeps/{sweep_id}/events",
        json={"attempt": 1, "events": list(events)},
        headers={"Authorization": f"Bearer {token}"},
    )
    assert response.status_code == 200, response.text


def trial(tune_id: str, state: str, epoch: int | None = None, loss: float | None = None) -> dict:
    event = {"type": "trial", "trial": tune_id, "state": state, "config": {"lr.base": 0.1 if tune_id == "a" else 0.01}}
    if epoch is not None:
        event |= {"epoch": epoch, "step": 10 * epoch, "metrics": {"val_loss": loss}}
    return event


def test_a_sweep_its_trials_and_its_best_trial(live, tmp_path):
    client = sdk(live)
    (tmp_path / "sweep.yaml").write_text(
        "name: lr-search\nbase:\n  workload: digits\n  epochs: 4\n  scaling: {num_workers: 2, cpus_per_worker: 0.5}\n"
        "search_space:\n  lr.base: {type: loguniform, low: 0.001, high: 0.3}\nmetric: val_loss\n"
    )
    sweep = client.sweeps.submit(tmp_path / "sweep.yaml", overrides=["base.epochs=2"])
    assert isinstance(sweep, Sweep) and sweep.state == "QUEUED" and sweep.spec["base"]["epochs"] == 2
    assert sweep.mode == "min" and sweep.best_trial is None
    assert client.sweeps.get("lr-s").id == sweep.id
    client.sweeps.submit(SPEC)
    with pytest.raises(Conflict):
        client.sweeps.get("lr-")

    tick(live.app)
    drive(live, sweep.id, {"type": "state", "state": "running"}, trial("a", "running"), trial("a", "running", 1, 0.5))
    drive(live, sweep.id, trial("b", "running"), trial("b", "running", 1, 0.3), trial("a", "running", 2, 0.2))
    sweep.reload()
    assert sweep.state == "RUNNING" and sweep.trials["RUNNING"] == 2  # the field: counts per state
    trials = list(sweep.list_trials())
    assert [(t.tune_id, t.number) for t in trials] == [("a", 1), ("b", 2)] and isinstance(trials[0], Trial)
    assert sweep.best_trial.id == trials[0].id and sweep.best_trial.metric == 0.2
    assert [t.id for t in client.trials.list(sweep.id, page_size=1)] == [t.id for t in trials]
    best = client.trials.get(sweep.best_trial.id)
    assert [(p.epoch, p.values["val_loss"]) for p in best.metrics()] == [(1, 0.5), (2, 0.2)]
    assert list(best.metrics_df()["val_loss"]) == [0.5, 0.2]
    assert [e.to_state for e in best.events()] == ["PENDING", "RUNNING"]
    assert list(sweep.logs()) == [f"log of {sweep.id}-1"]

    with pytest.raises(WaitTimeout):
        sweep.wait(timeout=0.2, poll=0.05)
    sweep.cancel()
    assert sweep.state in ("CANCELLING", "CANCELLED")
    assert [e.to_state for e in sweep.events()][:2] == ["QUEUED", "STARTING"]


def test_submit_sends_an_idempotency_key_so_a_retried_submit_gives_the_same_sweep(live):
    client = sdk(live)
    first = client.sweeps.submit(SPEC, idempotency_key="s-1")
    assert client.sweeps.submit(SPEC, idempotency_key="s-1").id == first.id
    # by default a fresh key per call: two calls are two sweeps, each safe to retry on its own
    assert client.sweeps.submit(SPEC).id != client.sweeps.submit(SPEC).id
    with pytest.raises(Conflict, match="s-1"):  # the same key with another spec
        client.sweeps.submit({**SPEC, "num_samples": 3}, idempotency_key="s-1")
