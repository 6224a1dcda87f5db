"""The training loop in-process (no Ray cluster, one worker), checkpoints, the torchrun entry and the
event reporter. Multi-worker behaviour: the test_distributed_* files."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
import torch
from ray.train import Checkpoint

from orchestrator_contract.jobs import DriverAssignment, JobSpec, MetricsEvent, StartupEvent, StateEvent, TrainingPlan
from tests.unit.harness import RecordingReporter, job_config, loop_device
from workers.runtime import torchrun
from workers.runtime.context import LocalContext
from workers.runtime.reporter import EventReporter
from workers.runtime.retry import RetryPolicy
from workers.runtime.train_loop import run_training
from workers.train import driver
from workers.train.callbacks import checkpoint_event
from workers.train.checkpoints import checkpoint_uri, load_model_from_checkpoint
from workers.workloads.digits import build

EPOCHS = 3
STEPS_PER_EPOCH = 44  # 1437 training samples // batch 32: whole steps only
METRICS_EVERY = 10


def plan_for(spec: JobSpec) -> TrainingPlan:
    return TrainingPlan(strategy="ddp", global_batch=spec.global_batch, lr=spec.scaled_lr)


def loop_config(**spec_fields) -> dict:
    return job_config("digits", workers=1, **{"epochs": EPOCHS, **spec_fields})


def epoch_events(reporter: RecordingReporter) -> list[MetricsEvent]:
    return [e for e in reporter.events if isinstance(e, MetricsEvent) and "val_loss" in e.values]


def step_events(reporter: RecordingReporter) -> list[MetricsEvent]:
    return [e for e in reporter.events if isinstance(e, MetricsEvent) and "lr" in e.values]


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    """One 3-epoch run shared by the tests that only look at what it produced."""
    config = loop_config(lr={"base": 0.05, "warmup_steps": 20})
    ctx = LocalContext(tmp_path_factory.mktemp("run"))
    reporter = RecordingReporter()
    metrics = run_training(config, ctx, reporter)
    return SimpleNamespace(config=config, ctx=ctx, reporter=reporter, metrics=metrics)


# --- the loop ------------------------------------------------------------------------------------


def test_loop_learns_digits(first_run):
    assert first_run.metrics["val_accuracy"] > 0.9
    assert first_run.metrics["val_loss"] < epoch_events(first_run.reporter)[0].values["val_loss"]
    assert first_run.metrics["samples_per_s"] > 0


def test_loop_emits_running_then_step_and_epoch_metrics(first_run):
    # The start-up timeline's stages aside (tests/unit/test_startup_timeline.py).
    events = [event for event in first_run.reporter.events if not isinstance(event, StartupEvent)]
    assert events[0] == StateEvent(state="running")
    assert all(isinstance(event, MetricsEvent) for event in events[1:])
    epochs = epoch_events(first_run.reporter)
    assert [(e.epoch, e.step) for e in epochs] == [(epoch, epoch * STEPS_PER_EPOCH) for epoch in range(1, EPOCHS + 1)]
    assert set(epochs[-1].values) == {"train_loss", "val_loss", "val_accuracy"}
    assert epochs[-1].values == {k: v for k, v in first_run.metrics.items() if k != "samples_per_s"}

    steps = step_events(first_run.reporter)
    assert [e.step for e in steps] == list(range(METRICS_EVERY, EPOCHS * STEPS_PER_EPOCH + 1, METRICS_EVERY))
    assert [e.epoch for e in steps[:5]] == [1, 1, 1, 1, 2]  # step 50 is in epoch 2
    assert all(set(e.values) == {"train_loss", "lr", "samples_per_s"} for e in steps)  # no tokens: 1 per sample
    assert all(e.values["samples_per_s"] > 0 for e in steps)


def test_the_seconds_checkpoints_blocked_training_ride_the_next_metric_point(first_run):
    """Goodput's checkpoint blocking: each epoch's checkpoint's seconds go with the next metric point, the last
    one's with a point of its own at the last step (no values: it merges into that step's point)."""
    events = [e for e in first_run.reporter.events if isinstance(e, MetricsEvent)]
    blocked = [e for e in events if e.checkpoint_blocked_s]
    assert len(blocked) == EPOCHS and all(0 < e.checkpoint_blocked_s < 60 for e in blocked)
    assert [e.step > epoch * STEPS_PER_EPOCH for epoch, e in enumerate(blocked[:-1], start=1)] == [True] * (EPOCHS - 1)
    last = events[-1]
    assert (last.values, last.step, last is blocked[-1]) == ({}, EPOCHS * STEPS_PER_EPOCH, True)


def test_learning_rate_warms_up_to_the_scaled_rate(first_run, caplog):
    # scaled: 0.05 for batch 64 -> 0.025 for batch 32; linear warmup over 20 steps
    rates = [e.values["lr"] for e in step_events(first_run.reporter)[:3]]
    assert rates == pytest.approx([0.025 * 11 / 20, 0.025, 0.025])


def test_the_scaled_rate_is_logged_once(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="workers.runtime.train_loop"):
        run_training(loop_config(epochs=1), LocalContext(tmp_path), RecordingReporter())
    lines = [r.getMessage() for r in caplog.records if "learning rate" in r.getMessage()]
    assert len(lines) == 1 and "learning rate 0.025 (0.05 for batch 64, linear scaling)" in lines[0]


def test_loop_checkpoints_every_epoch(first_run):
    ctx = first_run.ctx
    assert [(r["epoch"], r["step"]) for r in ctx.reported] == [(e, e * STEPS_PER_EPOCH) for e in range(1, EPOCHS + 1)]
    names = [f"checkpoint_{e * STEPS_PER_EPOCH:09d}" for e in range(1, EPOCHS + 1)]
    assert [path.name for path in ctx.checkpoints] == names
    assert {"val_accuracy", "samples_per_s"} <= ctx.reported[-1].keys()
    state = torch.load(ctx.checkpoints[-1] / "train_state.pt", weights_only=True)
    assert (state["strategy"], state["epoch"], state["epoch_steps"], state["step"]) == (
        "ddp",
        EPOCHS,
        STEPS_PER_EPOCH,
        EPOCHS * STEPS_PER_EPOCH,
    )
    assert {"optimizer", "scheduler", "scaler"} <= state.keys()
    rank = torch.load(ctx.checkpoints[-1] / "ranks" / "rank-00000.pt", weights_only=True)
    assert set(rank["rng"]) == {"torch", "cuda", "numpy", "python"}


def test_checkpoint_loads_into_an_equal_model(first_run):
    checkpoint_dir = str(first_run.ctx.checkpoints[-1])
    spec = first_run.config["spec"]
    model = load_model_from_checkpoint(checkpoint_dir, "digits", spec["config"])
    saved = torch.load(Path(checkpoint_dir) / "model.pt", weights_only=True)
    assert saved.keys() == model.state_dict().keys()
    assert all(torch.equal(saved[key], value) for key, value in model.state_dict().items())
    # The loaded model scores exactly what the run reported (it carries its own standardization).
    x, y = build(spec["config"], spec["seed"]).val_dataset.tensors
    with torch.no_grad():
        accuracy = (model(x).argmax(dim=1) == y).double().mean().item()
    assert accuracy == pytest.approx(first_run.metrics["val_accuracy"])


def test_resumed_run_continues_at_the_next_epoch(first_run, tmp_path):
    ctx = LocalContext(tmp_path, resume_from=first_run.ctx.checkpoints[1])  # saved after epoch 2
    reporter = RecordingReporter()
    run_training(first_run.config, ctx, reporter)

    assert [(e.epoch, e.step) for e in epoch_events(reporter)] == [(3, 3 * STEPS_PER_EPOCH)]
    assert [report["epoch"] for report in ctx.reported] == [3]
    # Model, optimizer, scheduler, RNG and sampler state all came back: the third epoch is replayed exactly.
    resumed = torch.load(ctx.checkpoints[-1] / "model.pt", weights_only=True)
    original = torch.load(first_run.ctx.checkpoints[-1] / "model.pt", weights_only=True)
    assert all(torch.equal(resumed[key], original[key]) for key in original)


def test_a_run_resuming_a_checkpoint_written_at_another_rate_trains_at_its_own(first_run, tmp_path):
    # PBT: another trial's checkpoint (rate 0.025), this trial's rate (0.2 for batch 64 -> 0.1 for 32).
    config = loop_config(lr={"base": 0.2, "warmup_steps": 20})
    ctx = LocalContext(tmp_path, resume_from=first_run.ctx.checkpoints[1])  # saved after epoch 2
    reporter = RecordingReporter()
    run_training(config, ctx, reporter)
    assert [e.epoch for e in epoch_events(reporter)] == [3]  # the epochs go on
    rates = [e.values["lr"] for e in step_events(reporter)]
    assert rates and rates == pytest.approx([0.1] * len(rates))
    state = torch.load(ctx.checkpoints[-1] / "train_state.pt", weights_only=True)
    assert state["scheduler"]["base_lrs"] == [pytest.approx(0.1)]
    assert state["optimizer"]["param_groups"][0]["initial_lr"] == pytest.approx(0.1)


def test_adopting_a_rate_keeps_the_warmup_position():
    from workers.runtime.step import TrainState, adopt_lr, warmup_schedule

    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    state = TrainState(model, optimizer, warmup_schedule(optimizer, 10), torch.amp.GradScaler("cpu", enabled=False))
    for _ in range(3):
        optimizer.step()
        state.scheduler.step()
    assert state.scheduler.get_last_lr() == [pytest.approx(0.04)]  # 4/10 of 0.1
    assert not adopt_lr(state, 0.1)  # the same rate: nothing changes (an exact resume)
    assert adopt_lr(state, 0.2)
    assert state.scheduler.get_last_lr() == [pytest.approx(0.08)] and optimizer.param_groups[0]["lr"] == pytest.approx(
        0.08
    )
    optimizer.step()
    state.scheduler.step()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.1)  # 5/10 of 0.2


def test_checkpoint_every_n_epochs_every_n_steps_and_after_the_last(tmp_path):
    config = loop_config(checkpoint={"every_epochs": 2, "every_steps": 30})
    ctx = LocalContext(tmp_path)
    run_training(config, ctx, RecordingReporter())
    assert [(r["epoch"], r["step"]) for r in ctx.reported] == [(1, 30), (2, 60), (2, 88), (3, 90), (3, 120), (3, 132)]
    # mid-epoch checkpoints carry only the position; epoch ones the epoch's metrics
    assert set(ctx.reported[0]) == {"epoch", "step"}


@pytest.mark.parametrize(
    ("precision", "device"),
    [
        ("bf16", "cpu"),
        pytest.param("bf16", "cuda", marks=pytest.mark.gpu),
        pytest.param("fp16", "cuda", marks=pytest.mark.gpu),
    ],
)
def test_a_low_precision_run_learns_digits(tmp_path, precision, device):
    """bf16 autocast on the CPU and on CUDA; fp16 (GPUs only) with its grad scaler, saved with the checkpoint."""
    config = loop_config(precision=precision, epochs=2, device=device)
    ctx = LocalContext(tmp_path, device=loop_device(config))
    metrics = run_training(config, ctx, RecordingReporter())
    assert metrics["val_accuracy"] > 0.9
    scaler = torch.load(ctx.checkpoints[-1] / "train_state.pt", weights_only=True, map_location="cpu")["scaler"]
    assert bool(scaler) == (precision == "fp16")  # the scaler is on for fp16 only


def test_resuming_with_another_strategy_is_refused(first_run, tmp_path):
    config = {**first_run.config, "plan": {**first_run.config["plan"], "strategy": "fsdp"}}
    with pytest.raises(ValueError, match="written by a ddp run; this run uses fsdp"):
        run_training(config, LocalContext(tmp_path, resume_from=first_run.ctx.checkpoints[0]), RecordingReporter())


# --- the torchrun entry --------------------------------------------------------------------------


def test_torchrun_entry_prints_steady_throughput_last(tmp_path, capsys):
    spec = JobSpec(workload="digits", epochs=2, scaling={"num_workers": 1}, strategy="auto")
    (tmp_path / "spec.json").write_text(spec.model_dump_json())
    args = ["--spec", str(tmp_path / "spec.json"), "--checkpoint-dir", str(tmp_path / "ckpt"), "--strategy", "ddp"]
    assert torchrun.main(args) == 0
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last["samples_per_s"] > 0 and last["val_accuracy"] > 0.8 and last["strategy"] == "ddp"
    assert (tmp_path / "ckpt" / f"checkpoint_{2 * STEPS_PER_EPOCH:09d}").is_dir()


def test_torchrun_entry_needs_a_strategy_for_auto(tmp_path):
    with pytest.raises(ValueError, match="--strategy"):
        torchrun.resolve_plan(JobSpec(workload="digits", strategy="auto"), None)


# --- checkpoint events ---------------------------------------------------------------------------


def test_checkpoint_event_sums_file_sizes_and_keeps_float_metrics(first_run):
    checkpoint = Checkpoint.from_directory(str(first_run.ctx.checkpoints[0]))
    metrics = {"epoch": 1, "step": 44, "val_accuracy": 0.9, "note": "text"}
    event = checkpoint_event(checkpoint, metrics, storage_path="/data/runs")
    assert (event.epoch, event.step, event.path) == (1, 44, checkpoint.path)
    files = [p for p in first_run.ctx.checkpoints[0].rglob("*") if p.is_file()]
    assert event.size_bytes == sum(p.stat().st_size for p in files)
    assert event.metrics == {"val_accuracy": 0.9}


def test_checkpoint_uri_puts_the_storage_scheme_back():
    checkpoint = SimpleNamespace(path="bucket/runs/job-1/checkpoint_000001")
    assert checkpoint_uri(checkpoint, "s3://bucket/runs") == "s3://bucket/runs/job-1/checkpoint_000001"
    assert checkpoint_uri(checkpoint, "/local/runs") == checkpoint.path


# --- the event reporter --------------------------------------------------------------------------


class FakeControlPlane:
    """An HTTP server that answers with the given statuses in turn, then 200; it records every request.

    POSTs take event batches; a GET answers ``get_body`` (the driver's assignment).
    """

    def __init__(self, statuses=(), port: int = 0, get_body: dict | None = None) -> None:
        self.statuses = list(statuses)
        self.requests: list[dict] = []
        self.received = threading.Event()
        self.release = threading.Event()  # cleared: hold every answer until set
        self.release.set()
        plane = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                plane.requests.append({"path": self.path, "authorization": self.headers["Authorization"], "body": body})
                plane.received.set()
                plane.release.wait(5)
                status = plane.statuses.pop(0) if plane.statuses else 200
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def do_GET(self):
                plane.requests.append({"path": self.path, "authorization": self.headers["Authorization"]})
                status = plane.statuses.pop(0) if plane.statuses else 200
                body = json.dumps(get_body).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def stop(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()

    def delivered_events(self) -> list[dict]:
        return [event for request in self.requests for event in request["body"]["events"]]


@pytest.fixture
def plane_factory():
    planes: list[FakeControlPlane] = []

    def make(**kwargs) -> FakeControlPlane:
        planes.append(FakeControlPlane(**kwargs))
        return planes[-1]

    yield make
    for plane in planes:
        plane.stop()


def fast_reporter(url: str, **kwargs) -> EventReporter:
    return EventReporter(url, "job-1", 2, "secret", backoff_min_s=0.01, backoff_max_s=0.05, **kwargs)


def metrics_event(epoch: int) -> MetricsEvent:
    return MetricsEvent(epoch=epoch, step=epoch * 10, values={"val_accuracy": 0.5})


def test_reporter_retries_5xx_then_delivers(plane_factory):
    plane = plane_factory(statuses=[503, 500])
    reporter = fast_reporter(plane.url)
    reporter.emit(StateEvent(state="running"))
    assert reporter.flush(5)
    reporter.close()

    assert len(plane.requests) == 3  # two failures, then the same batch again
    request = plane.requests[-1]
    assert request["path"] == "/internal/v1/jobs/job-1/events"
    assert request["authorization"] == "Bearer secret"
    assert request["body"] == {"attempt": 2, "events": [StateEvent(state="running").model_dump(mode="json")]}


def test_reporter_waits_for_a_control_plane_that_is_down():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    reporter = fast_reporter(f"http://127.0.0.1:{port}")
    reporter.emit(metrics_event(1))
    assert not reporter.flush(0.3)  # nothing listens yet
    for epoch in range(2, 2001):  # more than one batch (1000 events at most) waits for it
        reporter.emit(metrics_event(epoch))

    plane = FakeControlPlane(port=port)
    try:
        assert reporter.flush(5)
        assert [event["epoch"] for event in plane.delivered_events()] == list(range(1, 2001))  # all, in order
        assert reporter.dropped == 0
    finally:
        reporter.close()
        plane.stop()


@pytest.mark.parametrize("status", [401, 403])
def test_reporter_does_not_retry_a_refused_token(plane_factory, status):
    plane = plane_factory(statuses=[status])
    reporter = fast_reporter(plane.url)
    reporter.emit(metrics_event(1))
    assert reporter.flush(5)
    reporter.close()
    assert len(plane.requests) == 1
    assert reporter.dropped == 1


def test_reporter_retries_408_and_429(plane_factory):
    plane = plane_factory(statuses=[429, 408])
    reporter = fast_reporter(plane.url)
    reporter.emit(metrics_event(1))
    assert reporter.flush(5)
    reporter.close()
    assert len(plane.requests) == 3
    assert reporter.dropped == 0


def test_reporter_close_ends_the_retries_of_a_batch(plane_factory):
    plane = plane_factory(statuses=[503] * 1000)
    reporter = EventReporter(plane.url, "job-1", 2, "secret", backoff_min_s=5, backoff_max_s=5)
    reporter.emit(metrics_event(1))
    assert plane.received.wait(5)
    started = time.monotonic()
    reporter.close()  # during the 5 s wait
    assert time.monotonic() - started < 2
    assert len(plane.requests) == 1


def test_reporter_drops_a_batch_the_control_plane_refuses(plane_factory):
    plane = plane_factory(statuses=[400])
    reporter = fast_reporter(plane.url)
    reporter.emit(metrics_event(1))
    assert reporter.flush(5)
    reporter.emit(metrics_event(2))
    assert reporter.flush(5)
    reporter.close()
    assert len(plane.requests) == 2  # the refused batch was not retried
    assert reporter.dropped == 1


def test_reporter_drops_the_oldest_events_on_overflow(plane_factory, caplog):
    plane = plane_factory()
    plane.release.clear()
    reporter = fast_reporter(plane.url, max_queued=5)
    reporter.emit(metrics_event(0))
    assert plane.received.wait(5)  # event 0 is in flight and the server holds its answer
    with caplog.at_level(logging.WARNING, logger="workers.runtime.reporter"):
        for epoch in range(1, 9):
            reporter.emit(metrics_event(epoch))
    plane.release.set()
    assert reporter.flush(5)
    reporter.close()

    assert [event["epoch"] for event in plane.delivered_events()] == [0, 4, 5, 6, 7, 8]
    assert reporter.dropped == 3
    assert len([r for r in caplog.records if "full" in r.getMessage()]) == 1


def test_reporter_without_url_only_logs(caplog):
    reporter = EventReporter(None, "job-1", 1, "secret")
    with caplog.at_level(logging.INFO, logger="workers.runtime.reporter"):
        reporter.emit(StateEvent(state="running"))
    assert reporter.flush(0)
    reporter.close()
    assert '"state": "running"' in caplog.text


# --- the driver's assignment fetch ----------------------------------------------------------------


def test_driver_fetches_its_assignment_through_5xx(plane_factory, monkeypatch):
    monkeypatch.setattr(driver, "FETCH_RETRY", RetryPolicy(first_delay_s=0.01, cap_s=0.05, max_tries=5))
    spec = JobSpec(workload="digits")
    assignment = DriverAssignment(job_id="job-1", attempt=2, spec=spec, plan=plan_for(spec), storage_path="/data/runs")
    plane = plane_factory(statuses=[502, 503], get_body=assignment.model_dump(mode="json"))
    assert driver.fetch_assignment(plane.url, "job-1", 2, "secret") == assignment
    assert len(plane.requests) == 3
    assert plane.requests[-1] == {
        "path": "/internal/v1/jobs/job-1/assignment?attempt=2",
        "authorization": "Bearer secret",
    }


def test_driver_does_not_retry_a_refused_assignment(plane_factory, monkeypatch):
    monkeypatch.setattr(driver, "FETCH_RETRY", RetryPolicy(first_delay_s=0.01, cap_s=0.05, max_tries=5))
    plane = plane_factory(statuses=[401], get_body={"detail": "bad token"})
    with pytest.raises(httpx.HTTPStatusError):
        driver.fetch_assignment(plane.url, "job-1", 2, "wrong")
    assert len(plane.requests) == 1


def test_driver_gives_up_on_the_assignment_after_its_tries(plane_factory, monkeypatch):
    monkeypatch.setattr(driver, "FETCH_RETRY", RetryPolicy(first_delay_s=0.01, cap_s=0.05, max_tries=3))
    plane = plane_factory(statuses=[503] * 10, get_body={"detail": "restarting"})
    with pytest.raises(RuntimeError, match="after 3 tries: HTTP 503"):
        driver.fetch_assignment(plane.url, "job-1", 2, "secret")
    assert len(plane.requests) == 3


def test_the_driver_fetch_keeps_its_bounds():
    assert (driver.FETCH_RETRY.max_tries, driver.FETCH_RETRY.first_delay_s, driver.FETCH_RETRY.cap_s) == (5, 1.0, 10.0)
