"""The training loop preempted (docs/scheduling.md, "Preemption"), no Ray: told to checkpoint now, it writes a
checkpoint at that very step (mid-epoch, or at the end of the epoch whose last step it was), stops, and a run resumed
from that checkpoint ends exactly where an uninterrupted run ends, every step reported once. One process and a 2-rank
gloo group (every rank must stop at the same step)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch.distributed as dist

import workers.runtime.train_loop as train_loop
from orchestrator_contract.jobs import MetricsEvent
from tests.unit.harness import RecordingReporter, assert_same_state, job_config, model_state, run_on_ranks
from workers.runtime.context import LocalContext
from workers.runtime.control import control_poller
from workers.runtime.distributed import is_distributed
from workers.runtime.train_loop import PREEMPTED_KEY, run_training

EPOCHS = 3


class StepPoller:
    """Rank 0's poller, made deterministic: the control plane says ``checkpoint_now`` once the loop has
    reported the metric point of ``step`` (a point every step), i.e. during that step."""

    def __init__(self, reporter: RecordingReporter, step: int) -> None:
        self.reporter, self.step = reporter, step

    @property
    def checkpoint_now(self) -> bool:
        return any(isinstance(e, MetricsEvent) and e.step >= self.step for e in self.reporter.events)

    def close(self) -> None:
        pass


def config(workers: int, url: str | None = None) -> dict:
    built = job_config("digits", workers=workers, epochs=EPOCHS, metrics_every_steps=1, seed=3)
    # A control plane to listen to makes the loop watch for a preemption (the poller itself is patched).
    return {**built, "control_plane_url": url, "token": "jtk_test" if url else ""}


def step_points(reporter: RecordingReporter) -> list[int]:
    return [e.step for e in reporter.events if isinstance(e, MetricsEvent) and "lr" in e.values]


def preempted_then_resumed(workers: int, root: str, at_steps: list[int]) -> list[dict]:
    """On each rank: an uninterrupted run, then for each of ``at_steps`` a run preempted at that step and one
    resumed from the checkpoint it wrote."""
    rank = dist.get_rank() if is_distributed() else 0
    straight = LocalContext(Path(root) / "straight")
    straight_reporter = RecordingReporter()
    straight_metrics = run_training(config(workers), straight, straight_reporter)
    runs = []
    for at_step in at_steps:
        reporter = RecordingReporter()
        original = train_loop.control_poller
        train_loop.control_poller = lambda _config, r, at=at_step, rep=reporter: StepPoller(rep, at) if r == 0 else None
        try:
            first = LocalContext(Path(root) / f"preempted-{at_step}")
            preempted = run_training(config(workers, "http://control-plane.invalid"), first, reporter)
        finally:
            train_loop.control_poller = original
        resumed = LocalContext(Path(root) / f"resumed-{at_step}", resume_from=first.checkpoints[-1])
        resumed_reporter = RecordingReporter()
        runs.append(
            {
                "rank": rank,
                "straight": straight_metrics,
                "straight_final": str(straight.checkpoints[-1]),
                "straight_steps": step_points(straight_reporter),
                "preempted": preempted,
                "preempted_reports": first.reported,
                "preempted_steps": step_points(reporter),
                "preempted_epochs": [
                    e.epoch for e in reporter.events if isinstance(e, MetricsEvent) and "val_loss" in e.values
                ],
                "resumed": run_training(config(workers), resumed, resumed_reporter),
                "resumed_steps": step_points(resumed_reporter),
                "resumed_final": str(resumed.checkpoints[-1]),
            }
        )
    return runs


def check(run: dict, at_step: int, epoch_end: bool) -> None:
    """``at_step``: where the run was expected to stop."""
    assert run["preempted"] == {PREEMPTED_KEY: at_step}
    last = run["preempted_reports"][-1]
    assert last["step"] == at_step  # the checkpoint of the very step it was told at
    if epoch_end:  # the epoch's metrics and checkpoint came first
        assert "val_loss" in last and run["preempted_epochs"][-1] == last["epoch"]
    else:
        assert set(last) == {"epoch", "step"}
    # No step run twice, none missing: the resumed run starts right after the checkpoint.
    assert run["preempted_steps"] == list(range(1, at_step + 1))
    assert run["resumed_steps"][0] == at_step + 1
    assert run["preempted_steps"] + run["resumed_steps"] == run["straight_steps"]
    # Exact resume: the same parameters and the same final metrics as the uninterrupted run.
    assert_same_state(model_state(run["resumed_final"]), model_state(run["straight_final"]), atol=1e-6)
    for name in ("val_loss", "val_accuracy", "train_loss"):
        assert run["resumed"][name] == pytest.approx(run["straight"][name], rel=1e-6, abs=1e-7), name


def test_one_process_preempted_mid_epoch_and_at_an_epoch_end(tmp_path):
    # digits, one worker of 32: 44 steps an epoch; step 50 is mid-epoch 2, step 44 ends epoch 1.
    mid_epoch, epoch_end = preempted_then_resumed(1, str(tmp_path), [50, 44])
    check(mid_epoch, 50, epoch_end=False)
    check(epoch_end, 44, epoch_end=True)


def test_the_last_step_of_the_run_just_finishes(tmp_path, monkeypatch):
    reporter = RecordingReporter()
    monkeypatch.setattr(train_loop, "control_poller", lambda _c, r: StepPoller(reporter, EPOCHS * 44))
    metrics = run_training(config(1, "http://control-plane.invalid"), LocalContext(tmp_path), reporter)
    assert PREEMPTED_KEY not in metrics and "val_accuracy" in metrics


def test_a_job_that_is_not_preemptible_or_has_no_control_plane_never_asks(tmp_path, monkeypatch):
    """No control plane: no poller at all. Not preemptible: rank 0's poller only answers requests for stacks
    (hang detection), it never hears a preemption."""
    made = []

    def recording(config, rank):
        poller = control_poller(config, rank)
        made.append(None if poller is None else poller._preemption)
        return poller

    monkeypatch.setattr(train_loop, "control_poller", recording)
    exempt = {**config(1, "http://x.invalid"), "spec": {**config(1)["spec"], "preemptible": False}}
    for i, built in enumerate((config(1), exempt)):
        run_training(
            {**built, "spec": {**built["spec"], "epochs": 1}}, LocalContext(tmp_path / str(i)), RecordingReporter()
        )
    assert made == [None, False]


def test_two_ranks_stop_at_the_same_step_and_resume_exactly(tmp_path):
    # 2 workers of 32: 22 steps an epoch; rank 0 hears at step 30 (mid-epoch 2). Rank 1 learns it through
    # the background all-reduce read after the next step, so both stop at step 31 (SharedFlag).
    results = run_on_ranks(
        [(preempted_then_resumed, {"workers": 2, "root": str(tmp_path), "at_steps": [30]})], tmp_path
    )
    for ((run,),) in results:
        assert run["preempted"] == {PREEMPTED_KEY: 31}, run["rank"]
    check(results[0][0][0], 31, epoch_end=False)
