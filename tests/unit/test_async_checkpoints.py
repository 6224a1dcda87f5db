"""Asynchronous checkpoints (``checkpoint.async``, docs/jobs.md "Asynchronous checkpoints"): on 2 gloo ranks, the
same run with async on and off writes byte-equal checkpoints (model, optimizer, scheduler, position, each rank's
RNG and loss sums), and a run resumed from an asynchronous mid-epoch checkpoint ends with exactly the parameters of
the synchronous run. The loop's asynchronous checkpoints are snapshots written by ``CheckpointWriter``'s thread while
training goes on; a training function's folders are reported asynchronously as they are: ``LocalContext`` copies an asynchronous checkpoint in a background thread as Ray Train uploads
one (tests/unit/test_training_function.py and the Ray suites run the same loop on ``RayContext``)."""

from __future__ import annotations

import io
import threading
from pathlib import Path

import pytest
import torch

from orchestrator_contract.jobs import MetricsEvent
from tests.unit.harness import (
    MLP,
    RecordingReporter,
    assert_same_state,
    job_config,
    model_state,
    run_on_ranks,
    train,
)
from workers.runtime import checkpoint_writer
from workers.runtime.checkpoint_io import load, snapshot
from workers.runtime.checkpoint_writer import CheckpointWriter
from workers.runtime.context import LocalContext
from workers.runtime.train_loop import run_training

MID_EPOCH = "checkpoint_000000006"  # epoch 2, 2 of its 4 steps done


def config(asynchronous: bool) -> dict:
    return job_config(
        MLP,
        config={"dropout": 0.3},
        batch={"per_worker": 4, "accumulation_steps": 2},
        lr={"base": 0.2, "warmup_steps": 3},
        epochs=4,
        grad_clip_norm=1.0,
        checkpoint={"every_epochs": 1, "every_steps": 3, "keep": 100, "async": asynchronous},
    )


def files_of(checkpoint: str | Path) -> dict[str, bytes]:
    root = Path(checkpoint)
    return {str(path.relative_to(root)): path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file()}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, dict]:
    work = tmp_path_factory.mktemp("async-checkpoints")
    tasks = [
        (train, {"config": config(False), "root": work / "sync"}),
        (train, {"config": config(True), "root": work / "async"}),
        (train, {"config": config(True), "root": work / "resumed", "resume_from": work / "async" / MID_EPOCH}),
    ]
    sync, asynchronous, resumed = run_on_ranks(tasks, work)[0]
    return {"sync": sync, "async": asynchronous, "resumed": resumed}


def test_async_and_sync_checkpoints_are_byte_equal(runs):
    sync, asynchronous = runs["sync"]["checkpoints"], runs["async"]["checkpoints"]
    assert [Path(c).name for c in sync] == [Path(c).name for c in asynchronous]
    assert len(sync) == 8  # steps 3, 6, 9 and 15 (12 is an epoch end), and the 4 epoch ends
    for a, b in zip(sync, asynchronous, strict=True):
        sync_files, async_files = files_of(a), files_of(b)
        assert sync_files.keys() == async_files.keys(), (a, b)
        assert {"model.pt", "train_state.pt", "ranks/rank-00000.pt", "ranks/rank-00001.pt"} <= sync_files.keys()
        different = [name for name in sync_files if sync_files[name] != async_files[name]]
        assert not different, f"{Path(a).name}: {different}"


def test_a_run_resumed_from_an_async_checkpoint_ends_exactly_where_the_sync_run_does(runs):
    assert runs["resumed"]["checkpoints"][0].endswith("checkpoint_000000008")  # the next after step 6
    assert_same_state(model_state(runs["sync"]["checkpoints"][-1]), model_state(runs["resumed"]["checkpoints"][-1]))
    assert runs["resumed"]["metrics"]["train_loss"] == runs["sync"]["metrics"]["train_loss"]


def test_one_in_flight_the_next_waits_and_the_folder_becomes_the_contexts(tmp_path, monkeypatch):
    """A copy held back: the second report waits for it; the reported folder is deleted once copied; a
    synchronous report leaves its folder alone."""
    ctx = LocalContext(tmp_path / "root")
    release, copying = threading.Event(), []
    real_copy = ctx._copy

    def slow_copy(*args, **kwargs):
        copying.append(args[0])
        release.wait(10)
        real_copy(*args, **kwargs)

    monkeypatch.setattr(ctx, "_copy", slow_copy)
    first, second = tmp_path / "first", tmp_path / "second"
    for folder in (first, second):
        folder.mkdir()
        (folder / "state.pt").write_bytes(folder.name.encode())
    ctx.report({"step": 1}, str(first), asynchronous=True)  # returns at once, the copy held
    assert ctx.checkpoints == [] and first.exists()
    second_report = threading.Thread(target=ctx.report, args=({"step": 2}, str(second)), kwargs={"asynchronous": False})
    second_report.start()
    second_report.join(0.3)
    assert second_report.is_alive() and copying == [str(first)]  # waits for the first
    release.set()
    second_report.join(10)
    assert [p.name for p in ctx.checkpoints] == ["checkpoint_000000001", "checkpoint_000000002"]
    assert not first.exists() and second.exists()
    assert (ctx.checkpoints[0] / "state.pt").read_bytes() == b"first"


def test_the_writer_saves_the_snapshot_as_it_was_and_the_loop_trains_on_meanwhile(tmp_path, monkeypatch):
    """``CheckpointWriter``: the loop returns from ``submit`` before anything is written; training that changes the
    live state afterwards (in place, as an optimizer step does) does not reach the checkpoint; ``wait`` returns once
    it is reported; the folder it wrote is gone after."""
    ctx = LocalContext(tmp_path / "root")
    live = {"model.pt": {"weight": torch.zeros(3)}, "train_state.pt": {"steps": [1, 2]}}
    release, written = threading.Event(), []
    real_write = checkpoint_writer.write_checkpoint_files

    def held_write(folder, files, **kwargs):
        release.wait(10)
        real_write(folder, files, **kwargs)
        written.append(folder)

    monkeypatch.setattr(checkpoint_writer, "write_checkpoint_files", held_write)
    writer = CheckpointWriter(ctx)
    writer.submit(live, {"step": 1})
    assert ctx.checkpoints == []  # submit returned with the write held back
    live["model.pt"]["weight"].add_(1.0)
    live["train_state.pt"]["steps"].append(3)
    release.set()
    writer.wait()
    (checkpoint,) = ctx.checkpoints
    assert torch.equal(load(checkpoint / "model.pt")["weight"], torch.zeros(3))
    assert load(checkpoint / "train_state.pt") == {"steps": [1, 2]}
    assert (checkpoint / "manifests" / "rank-00000.json").exists()
    assert not Path(written[0]).exists()


def test_a_failed_asynchronous_checkpoint_fails_the_loop_at_its_next_wait(tmp_path, monkeypatch):
    ctx = LocalContext(tmp_path / "root")

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ctx, "report", full_disk)
    writer = CheckpointWriter(ctx)
    writer.submit({"model.pt": {"weight": torch.zeros(3)}}, {"step": 1})
    with pytest.raises(RuntimeError, match="asynchronous checkpoint failed") as failed:
        writer.wait()
    assert isinstance(failed.value.__cause__, OSError)
    writer.wait()  # raised once, then nothing in flight


def test_a_snapshot_keeps_what_is_shared_shared_and_saves_to_the_same_bytes():
    weight = torch.randn(4, 3)
    state = {"a": weight, "tied": weight, "row": weight[1], "moments": {"step": torch.tensor(3.0)}, "lrs": [0.1]}
    copied = snapshot(state)
    assert copied["a"] is copied["tied"] and copied["row"].untyped_storage().data_ptr() == copied["a"].data_ptr()
    assert copied["a"].data_ptr() != weight.data_ptr() and copied["lrs"] is not state["lrs"]
    assert saved_bytes(copied) == saved_bytes(state)


def saved_bytes(value) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def test_the_next_snapshot_reuses_the_buffers_and_still_copies_the_new_values():
    weight, buffers = torch.zeros(1000), {}
    first = snapshot({"w": weight}, buffers)
    first_storage = first["w"].untyped_storage().data_ptr()
    weight.add_(2.0)
    second = snapshot({"w": weight}, buffers)
    assert second["w"].untyped_storage().data_ptr() == first_storage  # no new host memory
    assert torch.equal(second["w"], torch.full((1000,), 2.0)) and second["w"].data_ptr() != weight.data_ptr()
    snapshot({"other": torch.ones(10)}, buffers)
    assert len(buffers) == 1  # only the last snapshot's buffers are kept


class StepWatcher(RecordingReporter):
    """Sets ``trained_past`` once a step metric after ``step`` arrives (the loop went on training)."""

    def __init__(self, step: int) -> None:
        super().__init__()
        self.step, self.trained_past = step, threading.Event()

    def emit(self, event) -> None:
        super().emit(event)
        if isinstance(event, MetricsEvent) and event.step > self.step:
            self.trained_past.set()


def test_the_loop_trains_on_while_its_asynchronous_checkpoint_is_written(tmp_path, monkeypatch):
    """The write of the step-3 checkpoint is held until the loop has reported a later step: a loop that waited for
    the write would never get there (the held write would give up after 20 s and the test fail)."""
    reporter = StepWatcher(step=3)
    real_write, held = checkpoint_writer.write_checkpoint_files, []

    def held_write(folder, files, **kwargs):
        step = files["train_state.pt"]["step"]
        if step == 3:
            held.append(reporter.trained_past.wait(20))
        real_write(folder, files, **kwargs)

    monkeypatch.setattr(checkpoint_writer, "write_checkpoint_files", held_write)
    spec = {
        "epochs": 2,
        "batch": {"per_worker": 4},
        "metrics_every_steps": 1,
        "checkpoint": {"every_steps": 3, "keep": 100, "async": True},
    }
    ctx = LocalContext(tmp_path)
    run_training(job_config(MLP, workers=1, **spec), ctx, reporter)
    assert held == [True]
    assert ctx.checkpoints[0].name == "checkpoint_000000003", ctx.checkpoints
