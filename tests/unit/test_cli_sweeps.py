"""``orch sweeps`` and ``orch trials`` against the unit-test app over real HTTP, the sweep driver played by
posting its events: every command, -o json with the API's keys, and ``submit --follow``'s trial lines and
exit codes."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from orchestrator.backend import RunStatus
from tests.unit import cli_support
from tests.unit.api_helpers import reconcile, run_token_at, tick
from tests.unit.cli_support import newest, orch

SWEEP = """\
name: lr-search
base:
  workload: digits
  epochs: 4
  scaling:
    num_workers: 2
    cpus_per_worker: 0.5
search_space:
  lr.base:
    type: loguniform
    low: 0.001
    high: 0.3
metric: val_loss
"""


_own_config = cli_support.quick_follow


@pytest.fixture
def sweep_file(tmp_path):
    path = tmp_path / "sweep.yaml"
    path.write_text(SWEEP)
    return path


def _drive(live, sweep_id: str, *events: dict) -> None:
    token = run_token_at(live.url, live.backend, f"{sweep_id}-1")
    response = httpx.post(
        f"{live.url}/internal/v1/sweeps/{sweep_id}/events",
        json={"attempt": 1, "events": list(events)},
        headers={"Authorization": f"Bearer {token}"},
    )
    assert response.status_code == 200, response.text


def _trial(tune_id: str, state: str, epoch: int | None = None, loss: float | None = None, **extra) -> dict:
    event = {"type": "trial", "trial": tune_id, "state": state, "config": {"lr.base": 0.1 if tune_id == "a" else 0.01}}
    if epoch is not None:
        event |= {"epoch": epoch, "step": epoch * 10, "metrics": {"val_loss": loss}}
    return event | extra


def _running_sweep(live, sweep_file) -> str:
    result = orch(live, "sweeps", "submit", "-f", str(sweep_file), "-o", "json")
    assert result.exit_code == 0, result.output
    sweep_id = json.loads(result.stdout)["id"]
    tick(live.app)
    _drive(
        live,
        sweep_id,
        {"type": "state", "state": "running"},
        _trial("a", "running", 1, 0.5),
        _trial("b", "running", 1, 0.3),
        _trial("b", "stopped", message="stopped by the scheduler after 1 of 4 epochs"),
    )
    return sweep_id


def test_sweep_and_trial_commands(live, sweep_file):
    sweep_id = _running_sweep(live, sweep_file)
    sweep = json.loads(orch(live, "sweeps", "get", "lr-se", "-o", "json").stdout)
    assert sweep["id"] == sweep_id and {"metric", "mode", "total_trials", "trials", "best_trial"} <= sweep.keys()
    assert sweep_id in orch(live, "sweeps", "list").stdout
    assert [s["id"] for s in json.loads(orch(live, "sweeps", "list", "-o", "json", "--state", "RUNNING").stdout)] == [
        sweep_id
    ]
    events = json.loads(orch(live, "sweeps", "events", sweep_id, "-o", "json").stdout)
    assert events[-1]["to_state"] == "RUNNING"

    trials = json.loads(orch(live, "sweeps", "trials", sweep_id, "-o", "json").stdout)
    assert [(t["tune_id"], t["state"], t["stopped_early"]) for t in trials] == [
        ("a", "RUNNING", False),
        ("b", "STOPPED", True),
    ]
    table = orch(live, "sweeps", "trials", sweep_id).stdout
    assert "STOPPED" in table and "yes" in table and '{"lr.base":0.01}' in table and "\x1b[" not in table

    best = json.loads(orch(live, "sweeps", "best", sweep_id, "-o", "json").stdout)
    assert best["id"] == trials[1]["id"] and best["metric"] == 0.3  # val_loss: lower is better

    trial = json.loads(orch(live, "trials", "get", trials[1]["id"], "-o", "json").stdout)
    assert trial["best_metric"] == 0.3 and trial["stopped_early"] is True
    points = json.loads(orch(live, "trials", "metrics", trials[1]["id"], "-o", "json").stdout)
    assert [(p["epoch"], p["values"]["val_loss"]) for p in points] == [(1, 0.3)]
    history = json.loads(orch(live, "trials", "events", trials[1]["id"], "-o", "json").stdout)
    assert [e["to_state"] for e in history] == ["PENDING", "RUNNING", "STOPPED"]
    assert "STOPPED" in orch(live, "trials", "events", trials[1]["id"]).stdout

    assert orch(live, "sweeps", "logs", sweep_id).stdout == f"log of {sweep_id}-1\n"
    assert orch(live, "sweeps", "wait", sweep_id, "--timeout", "0.3").exit_code == 124
    assert orch(live, "sweeps", "cancel", sweep_id).exit_code == 2  # no terminal: -y needed
    assert json.loads(orch(live, "sweeps", "cancel", sweep_id, "-y", "-o", "json").stdout)["state"] == "CANCELLING"
    reconcile(live.app)
    assert orch(live, "sweeps", "wait", sweep_id).exit_code == 3


def test_a_sweep_without_a_best_trial_and_a_bad_sweep_file(live, sweep_file, tmp_path):
    sweep_id = json.loads(orch(live, "sweeps", "submit", "-f", str(sweep_file), "-o", "json").stdout)["id"]
    none_yet = orch(live, "sweeps", "best", sweep_id)
    assert none_yet.exit_code == 1 and "no best trial yet" in none_yet.stderr
    orch(live, "sweeps", "cancel", sweep_id, "-y")
    bad = tmp_path / "bad.yaml"
    bad.write_text(SWEEP.replace("low: 0.001", "low: 0.5"))
    result = orch(live, "sweeps", "submit", "-f", str(bad))
    assert result.exit_code == 2 and f"{bad}:9: search_space.lr.base" in result.stderr and "low (0.5)" in result.stderr


def test_submit_follow_prints_trials_and_exits_with_the_sweeps_result(live, sweep_file):
    def driver():
        sweep_id = newest(live, "sweeps")
        tick(live.app)
        _drive(live, sweep_id, {"type": "state", "state": "running"}, _trial("a", "running", 1, 0.5))
        time.sleep(0.5)
        _drive(live, sweep_id, _trial("a", "succeeded", 2, 0.2), {"type": "state", "state": "succeeded"})
        live.backend.runs[f"{sweep_id}-1"] = RunStatus.SUCCEEDED
        reconcile(live.app)

    thread = threading.Thread(target=driver, daemon=True)
    thread.start()
    result = orch(live, "sweeps", "submit", "-f", str(sweep_file), "--follow", "--timeout", "30")
    thread.join()
    assert result.exit_code == 0, result.output
    assert "==> trial 1 RUNNING" in result.stdout and "==> trial 1 SUCCEEDED best val_loss 0.2" in result.stdout
    assert "SUCCEEDED: best trial" in result.stdout and "\x1b[" not in result.output
