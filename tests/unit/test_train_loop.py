"""The training loop in-process (no Ray cluster), checkpoints, workload loading and the event reporter."""

from __future__ import annotations

import json
import logging
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import httpx
import pytest
import torch
from ray.train import Checkpoint

from workers import driver
from workers.callbacks import checkpoint_event
from workers.checkpoints import checkpoint_uri, load_checkpoint, load_model_from_checkpoint
from workers.context import LocalContext
from workers.reporter import EventReporter
from workers.spec import DriverAssignment, JobSpec, MetricsEvent, StateEvent
from workers.train_loop import run_training
from workers.workloads import load_workload
from workers.workloads.digits import build

EPOCHS = 3
STEPS_PER_EPOCH = 45  # ceil(1437 training samples / batch 32)


class RecordingReporter:
    def __init__(self) -> None:
        self.events: list = []

    def emit(self, event) -> None:
        self.events.append(event)

    def flush(self, timeout_s: float) -> bool:
        return True

    def close(self) -> None:
        pass


def loop_config(**digits_config) -> dict:
    spec = JobSpec(workload="digits", config={"epochs": EPOCHS, **digits_config}, scaling={"num_workers": 1})
    return {
        "job_id": "job-1",
        "attempt": 1,
        "control_plane_url": None,
        "token": "secret",
        "spec": spec.model_dump(mode="json"),
    }


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    """One 3-epoch run shared by the tests that only look at what it produced."""
    config = loop_config()
    ctx = LocalContext(tmp_path_factory.mktemp("run"))
    reporter = RecordingReporter()
    metrics = run_training(config, ctx, reporter)
    return SimpleNamespace(config=config, ctx=ctx, reporter=reporter, metrics=metrics)


# --- the loop ------------------------------------------------------------------------------------


def test_loop_learns_digits(first_run):
    assert first_run.metrics["val_accuracy"] > 0.85
    assert first_run.metrics["val_loss"] < first_run.reporter.events[1].values["val_loss"]


def test_loop_emits_running_then_one_metrics_event_per_epoch(first_run):
    events = first_run.reporter.events
    assert events[0] == StateEvent(state="running")
    assert all(isinstance(event, MetricsEvent) for event in events[1:])
    assert [(e.epoch, e.step) for e in events[1:]] == [
        (epoch, epoch * STEPS_PER_EPOCH) for epoch in range(1, EPOCHS + 1)
    ]
    assert set(events[-1].values) == {"train_loss", "val_loss", "val_accuracy"}
    assert events[-1].values == first_run.metrics


def test_loop_checkpoints_every_epoch(first_run):
    ctx = first_run.ctx
    assert [report["epoch"] for report in ctx.reported] == [1, 2, 3]
    assert len(ctx.checkpoints) == EPOCHS
    state = load_checkpoint(ctx.checkpoints[-1])
    assert (state["epoch"], state["step"]) == (EPOCHS, EPOCHS * STEPS_PER_EPOCH)
    assert set(state) == {"model", "optimizer", "epoch", "step"}


def test_checkpoint_loads_into_an_equal_model(first_run):
    checkpoint_dir = str(first_run.ctx.checkpoints[-1])
    model = load_model_from_checkpoint(checkpoint_dir, "digits", first_run.config["spec"]["config"])
    saved = load_checkpoint(checkpoint_dir)["model"]
    assert saved.keys() == model.state_dict().keys()
    assert all(torch.equal(saved[key], value) for key, value in model.state_dict().items())
    # The loaded model scores exactly what the run reported (it carries its own standardization).
    val = build(first_run.config["spec"]["config"]).val_dataset
    x, y = val.tensors
    with torch.no_grad():
        accuracy = (model(x).argmax(dim=1) == y).double().mean().item()
    assert accuracy == pytest.approx(first_run.metrics["val_accuracy"])


def test_resumed_run_continues_at_the_next_epoch(first_run, tmp_path):
    ctx = LocalContext(tmp_path, resume_from=first_run.ctx.checkpoints[1])  # saved after epoch 2
    reporter = RecordingReporter()
    run_training(first_run.config, ctx, reporter)

    assert [(e.epoch, e.step) for e in reporter.events if isinstance(e, MetricsEvent)] == [
        (3, 3 * STEPS_PER_EPOCH)
    ]
    assert [report["epoch"] for report in ctx.reported] == [3]
    # Model, optimizer and sampler state all came back: the third epoch is replayed exactly.
    resumed = load_checkpoint(ctx.checkpoints[-1])["model"]
    original = load_checkpoint(first_run.ctx.checkpoints[-1])["model"]
    assert all(torch.equal(resumed[key], original[key]) for key in original)


def test_checkpoint_every_n_epochs_and_after_the_last(tmp_path):
    config = loop_config(epochs=3)
    config["spec"]["checkpoint"]["every_epochs"] = 2
    ctx = LocalContext(tmp_path)
    run_training(config, ctx, RecordingReporter())
    assert [report["epoch"] for report in ctx.reported] == [2, 3]


# --- workloads and checkpoint events ---------------------------------------------------------------


def test_load_workload_resolves_builtin_and_custom_names():
    assert load_workload("digits") is build
    assert load_workload("workers.workloads.digits:build") is build


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("digits:", "malformed"),
        ("no/such", "malformed"),
        ("workers.workloads.digits:nope", "has no function"),
        ("no_such_package.module:build", "not installed"),
    ],
)
def test_load_workload_explains_bad_names(name, problem):
    with pytest.raises(ValueError, match=problem):
        load_workload(name)


def test_checkpoint_event_sums_file_sizes_and_keeps_float_metrics(first_run):
    checkpoint = Checkpoint.from_directory(str(first_run.ctx.checkpoints[0]))
    metrics = {"epoch": 1, "step": 45, "val_accuracy": 0.9, "note": "text"}
    event = checkpoint_event(checkpoint, metrics, storage_path="/data/runs")
    assert (event.epoch, event.step, event.path) == (1, 45, checkpoint.path)
    assert event.size_bytes == (first_run.ctx.checkpoints[0] / "checkpoint.pt").stat().st_size
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
                plane.requests.append(
                    {"path": self.path, "authorization": self.headers["Authorization"], "body": body}
                )
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

    plane = FakeControlPlane(port=port)
    try:
        assert reporter.flush(5)
        assert [event["epoch"] for event in plane.delivered_events()] == [1]
    finally:
        reporter.close()
        plane.stop()


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
    with caplog.at_level(logging.WARNING, logger="workers.reporter"):
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
    with caplog.at_level(logging.INFO, logger="workers.reporter"):
        reporter.emit(StateEvent(state="running"))
    assert reporter.flush(0)
    reporter.close()
    assert '"state": "running"' in caplog.text


# --- the driver's assignment fetch ----------------------------------------------------------------


def test_driver_fetches_its_assignment_through_5xx(plane_factory, monkeypatch):
    monkeypatch.setattr(driver, "FETCH_BACKOFF_S", (0.01, 0.05))
    assignment = DriverAssignment(
        job_id="job-1", attempt=2, spec=JobSpec(workload="digits"), storage_path="/data/runs"
    )
    plane = plane_factory(statuses=[502, 503], get_body=assignment.model_dump(mode="json"))
    assert driver.fetch_assignment(plane.url, "job-1", 2, "secret") == assignment
    assert len(plane.requests) == 3
    assert plane.requests[-1] == {
        "path": "/internal/v1/jobs/job-1/assignment?attempt=2",
        "authorization": "Bearer secret",
    }


def test_driver_does_not_retry_a_refused_assignment(plane_factory, monkeypatch):
    monkeypatch.setattr(driver, "FETCH_BACKOFF_S", (0.01, 0.05))
    plane = plane_factory(statuses=[401], get_body={"detail": "bad token"})
    with pytest.raises(httpx.HTTPStatusError):
        driver.fetch_assignment(plane.url, "job-1", 2, "wrong")
    assert len(plane.requests) == 1
