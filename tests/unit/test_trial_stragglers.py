"""Stragglers in sweep trials, docs/jobs.md "Stragglers": a trial's rank 0 puts each rank's own seconds per step
over the epoch in its epoch result (what Ray Tune gets: the built-in loop and a training function, 2 gloo ranks),
the sweep driver's callback forwards them (``TrialEvent.rank_step_s``), and the control plane flags a rank slower
than ``failure.straggler_factor`` times the others' median for ``ORCHESTRATOR_STRAGGLER_WINDOWS`` epochs in a row:
a warning only (the fake cluster; the real one: tests/integration/test_sweeps_on_ray.py)."""

from __future__ import annotations

import math
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from sqlalchemy import select

from orchestrator.db.models import NodeFault, Sweep, Trial
from orchestrator.services.sweep_events import apply_sweep_events
from orchestrator_contract.jobs import JobSpec, TrainingPlan
from orchestrator_contract.sweeps import RANK_STEP_S_KEY, SweepEventBatch
from tests.unit.api_helpers import ADMIN, auth
from tests.unit.harness import RecordingReporter, loop_config, run_on_ranks, train
from tests.unit.test_deadlines import running
from tests.unit.test_stragglers import slow_run
from tests.unit.test_train_function import SLOW_FORWARD_S, SlowOnRankOne
from workers.runtime.context import LocalContext
from workers.runtime.function import run_function
from workers.runtime.train_loop import EPOCH_RANK_TIMES

# --- the control plane ------------------------------------------------------------------------------------

THREE_RANKS = {"workload": "digits", "epochs": 10, "scaling": {"num_workers": 3, "cpus_per_worker": 0.5}}
SWEEP = {"base": THREE_RANKS, "search_space": {"lr.base": {"type": "choice", "values": [0.1, 0.2]}}}


def epoch(n: int, times: list[float] | None, trial: str = "t_00000", state: str = "running") -> dict:
    event = {"type": "trial", "trial": trial, "state": state, "config": {"lr.base": 0.1}}
    if n:
        event |= {"epoch": n, "step": 10 * n, "metrics": {"val_accuracy": 0.5}, "rank_step_s": times}
    return event


def post(client, sweep_id: str, token: str, *events: dict) -> None:
    answer = client.post(
        f"/internal/v1/sweeps/{sweep_id}/events", json={"attempt": 1, "events": list(events)}, headers=auth(token)
    )
    assert answer.status_code == 200, answer.text


def trial_view(client, sweep_id: str, tune_id: str = "t_00000") -> dict:
    trials = client.get(f"/v1/sweeps/{sweep_id}/trials", headers=auth(ADMIN)).json()
    return next(t for t in (trials["items"] if isinstance(trials, dict) else trials) if t["tune_id"] == tune_id)


def reasons(client, trial_id: str) -> list[tuple[str, str, str]]:
    history = client.get(f"/v1/trials/{trial_id}/events", headers=auth(ADMIN)).json()
    return [(e["from_state"], e["to_state"], e["reason"]) for e in history]


SLOW, FAST = [0.1, 0.2, 0.1], [0.1, 0.1, 0.1]


def test_a_trial_rank_slow_three_epochs_in_a_row_is_a_straggler_once_and_only_warned(app, client, backend):
    sweep_id, token = running(app, client, backend, "sweeps", **SWEEP)
    post(client, sweep_id, token, epoch(0, None), epoch(1, SLOW), epoch(2, SLOW))
    post(client, sweep_id, token, epoch(3, FAST))  # a fast epoch: the count starts again
    post(client, sweep_id, token, epoch(4, SLOW), epoch(5, SLOW))
    post(client, sweep_id, token, epoch(4, SLOW), epoch(5, SLOW))  # a retried batch counts nothing twice
    trial = trial_view(client, sweep_id)
    assert trial["stragglers"] is None, trial
    post(client, sweep_id, token, epoch(6, [0.1, 0.31, 0.1]))
    trial = trial_view(client, sweep_id)
    (straggler,) = trial["stragglers"]
    assert (straggler["rank"], straggler["ratio"], straggler["epoch"], straggler["step"]) == (1, 3.1, 6, 60)
    assert trial["state"] == "RUNNING" and trial["reason"] == "straggler", trial
    assert "rank 1 is a straggler: 3.1x the other ranks' median" in trial["message"]
    assert "for 3 epochs in a row, at epoch 6" in trial["message"]
    post(client, sweep_id, token, epoch(7, SLOW))  # still slow: no second row
    assert reasons(client, trial["id"]).count(("RUNNING", "RUNNING", "straggler")) == 1
    # Just under the factor (1.5) is not slow.
    post(client, sweep_id, token, *(epoch(8 + i, [0.1, 0.1, 0.149]) for i in range(3)))
    assert [s["rank"] for s in trial_view(client, sweep_id)["stragglers"]] == [1]
    # A warning only: no node is blamed (the control plane does not know a trial's nodes), the sweep runs on.
    with app.state.service.sessions.begin() as session:
        assert session.scalars(select(NodeFault)).all() == []
        assert session.get(Sweep, sweep_id).state.value == "RUNNING"


def test_an_ended_trials_late_epochs_and_a_one_rank_trial_flag_nothing(app, client, backend):
    sweep_id, token = running(app, client, backend, "sweeps", **SWEEP)
    post(client, sweep_id, token, epoch(0, None, "a"), epoch(1, SLOW, "a"), epoch(0, None, "a", "stopped"))
    post(client, sweep_id, token, *(epoch(n, SLOW, "a") for n in range(2, 6)))
    a = trial_view(client, sweep_id, "a")
    assert (a["state"], a["stragglers"]) == ("STOPPED", None), a
    # The times beyond the trial's ranks (num_workers 3) are not its ranks': only the first 3 count.
    post(client, sweep_id, token, *(epoch(n, [0.1, 0.1, 0.1, 5.0], "b") for n in range(1, 5)))
    assert trial_view(client, sweep_id, "b")["stragglers"] is None


def test_a_trials_straggler_windows_come_from_the_settings(app, client, backend):
    """``apply_sweep_events`` takes the window count (``ORCHESTRATOR_STRAGGLER_WINDOWS``), as a job's events do."""
    sweep_id, _token = running(app, client, backend, "sweeps", **SWEEP)
    storage = app.state.service.storages.of(None)  # the default cluster's
    for events in ([epoch(0, None)], [epoch(1, SLOW)], [epoch(2, SLOW)]):
        with app.state.service.sessions.begin() as session:
            sweep = session.get(Sweep, sweep_id)
            apply_sweep_events(session, sweep, SweepEventBatch(attempt=1, events=events), storage, straggler_windows=2)
    with app.state.service.sessions.begin() as session:
        trial = session.scalars(select(Trial).where(Trial.sweep_id == sweep_id)).one()
        assert trial.straggler_windows == {"0": 0, "1": 2, "2": 0}
        assert [(s["rank"], s["epoch"]) for s in trial.stragglers] == [(1, 2)]


def test_a_pbt_clone_counts_its_slow_epochs_anew(app, client, backend):
    body = {**SWEEP, "search_space": {"lr.base": {"type": "loguniform", "low": 1e-3, "high": 0.3}}}
    sweep_id, token = running(
        app, client, backend, "sweeps", **body, scheduler={"type": "pbt", "perturbation_interval": 1}
    )
    post(client, sweep_id, token, epoch(0, None), epoch(1, SLOW), epoch(2, SLOW))
    cloned = {**epoch(3, SLOW), "config": {"lr.base": 0.05}}  # a new Train run from another trial's checkpoint
    post(client, sweep_id, token, cloned)
    with app.state.service.sessions.begin() as session:
        trial = session.scalars(select(Trial).where(Trial.sweep_id == sweep_id)).one()
        assert (trial.straggler_windows, trial.stragglers) == ({"0": 0, "1": 1, "2": 0}, None)


@pytest.mark.parametrize(
    "fields",
    [
        {"base": {**THREE_RANKS, "failure": {"on_straggler": "restart"}}},
        {"search_space": {"failure.on_straggler": {"type": "choice", "values": ["warn", "restart"]}}},
    ],
)
def test_on_straggler_restart_in_a_sweep_is_422(client, fields):
    answer = client.post("/v1/sweeps", json={**SWEEP, **fields}, headers=auth(ADMIN))
    assert answer.status_code == 422, answer.text
    assert "on_straggler restart: a straggler in a sweep trial only warns" in answer.text, answer.text
    assert client.get("/v1/sweeps", headers=auth(ADMIN)).json() == []


def test_on_straggler_warn_in_a_sweep_is_fine(client):
    body = {**SWEEP, "base": {**THREE_RANKS, "failure": {"on_straggler": "warn", "straggler_factor": 2}}}
    assert client.post("/v1/sweeps", json=body, headers=auth(ADMIN)).status_code == 201


# --- the workers ------------------------------------------------------------------------------------------


def _tune_result(reported: dict) -> dict:
    """A trial's epoch result as the sweep driver's callback gets it: the run's report and Tune's keys."""
    return {**reported, "checkpoint_path": "/s/trials/t/checkpoint_1", "training_iteration": 1, "done": False}


def forwarded(result: dict):
    """The TrialEvent the sweep driver's callback sends for ``result``."""
    from orchestrator_contract.sweeps import SweepSpec
    from workers.tune.tuner import REPORTERS, TrialEventForwarder

    reporter = REPORTERS["sweep-1"] = RecordingReporter()
    try:
        forwarder = TrialEventForwarder("sweep-1", SweepSpec.model_validate(SWEEP))
        forwarder.on_trial_result(1, [], SimpleNamespace(trial_id="t_00000", config={"lr.base": 0.1}), result)
    finally:
        REPORTERS.pop("sweep-1")
    (event,) = reporter.events
    return event


def test_the_loops_epoch_results_carry_each_ranks_own_time_in_a_trial_only(tmp_path):
    """Rank 1 sleeps 40 ms a step more: each epoch result of a trial's run (``EPOCH_RANK_TIMES``) holds every rank's
    own seconds per step over the epoch, rank 1's the slower; a job's run carries none in its checkpoints' metrics
    and still sends its metric windows' (``MetricsEvent.rank_step_s``)."""
    trial = {**slow_run(0.005), EPOCH_RANK_TIMES: True, "background_checkpoints": False}
    trial["spec"]["epochs"] = 2
    job = slow_run(0.005)
    (as_trial, as_job), _rank1 = run_on_ranks(
        [(train, {"config": trial, "root": tmp_path / "trial"}), (train, {"config": job, "root": tmp_path / "job"})],
        tmp_path,
    )
    results = as_trial["reported"]
    assert [r["epoch"] for r in results] == [1, 2], results
    for result in results:
        fast, slow = result[RANK_STEP_S_KEY]
        assert slow >= 0.04 and slow > 1.5 * fast, result
    event = forwarded(_tune_result(results[-1]))
    assert event.rank_step_s == results[-1][RANK_STEP_S_KEY] and RANK_STEP_S_KEY not in event.metrics, event
    assert event.metrics["train_loss"] == results[-1]["train_loss"]
    assert all(RANK_STEP_S_KEY not in r for r in as_job["reported"]), as_job["reported"]
    assert any(e.get("rank_step_s") for e in as_job["events"] if e.get("type") == "metrics")


@pytest.mark.parametrize(
    "value",
    [0.3, [0.1], [0.1, -1.0], [0.1, math.nan], [0.1, True], ["0.1", 0.2], [0.1] * 1025, None],
)
def test_what_is_no_list_of_times_is_forwarded_as_none(value):
    """A user's function may report a metric of that name: the sweep driver's callback never fails on it."""
    result = _tune_result({"epoch": 1, "step": 10, "val_accuracy": 0.5, RANK_STEP_S_KEY: value})
    assert forwarded(result).rank_step_s is None


def slow_rank_epochs(ctx) -> None:
    """A plain DDP loop with no timing code, a checkpoint report per epoch (a trial's result); rank 0 also reports
    a metric mid-epoch, which reaches no Tune result."""
    model = ctx.prepare(SlowOnRankOne())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    loader = ctx.shard(data, batch_size=8)
    for _ in range(ctx.epochs):
        for step, (x, y) in enumerate(loader, start=1):
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if step == 2 and ctx.rank == 0:
                ctx.report({"loss": loss.item()})
        with tempfile.TemporaryDirectory() as folder:
            Path(folder, "model.pt").write_bytes(b"weights")
            ctx.report({"loss": loss.item()}, folder)


def _function_trial(root: str, trial: bool) -> list[dict]:
    from workers.runtime import stragglers

    stragglers.PUBLISH_EVERY_S = 0.0  # every forward: rank 1 has published its steps before rank 0's report
    spec = JobSpec(
        entrypoint=f"{__name__}:slow_rank_epochs",
        scaling={"num_workers": 2},
        batch={"per_worker": 8},
        epochs=2,
        checkpoint={"async": False},
    )
    config = {**loop_config(spec, TrainingPlan.fixed(spec)), EPOCH_RANK_TIMES: trial}
    context = LocalContext(root)
    run_function(config, context, RecordingReporter())
    return context.reported


def test_a_functions_checkpoint_reports_carry_each_ranks_own_time_in_a_trial_only(tmp_path):
    (trial, job), _rank1 = run_on_ranks(
        [
            (_function_trial, {"root": str(tmp_path / "trial"), "trial": True}),
            (_function_trial, {"root": str(tmp_path / "job"), "trial": False}),
        ],
        tmp_path,
    )
    assert len(trial) == 2, trial  # an epoch's checkpoint each
    for result in trial:
        fast, slow = result[RANK_STEP_S_KEY]
        assert slow >= SLOW_FORWARD_S * 0.9 and slow > 3 * fast, trial
    assert forwarded(_tune_result(trial[-1])).rank_step_s == trial[-1][RANK_STEP_S_KEY]
    assert all(RANK_STEP_S_KEY not in r for r in job), job
