"""Checkpoints that can be trusted, on the workers' side (no Ray cluster): manifests, verification,
resuming only from a whole checkpoint, and Ray's run snapshot kept in line with storage."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pyarrow.fs
import pytest
from ray.train import Checkpoint

from orchestrator_contract.jobs import CHECKPOINT_METRICS
from tests.unit.harness import MLP, RecordingReporter, job_config, run_on_ranks, train
from workers.runtime.context import LocalContext, latest_checkpoint
from workers.runtime.manifest import (
    checkpoint_folders,
    choose_resume_checkpoint,
    newest_verified_checkpoint,
    verify_checkpoint,
    write_manifest,
)
from workers.runtime.train_loop import run_training
from workers.train.callbacks import checkpoint_event
from workers.train.run_snapshot import SNAPSHOT_FILE, forget_deleted_checkpoints


def write_part(directory: Path, rank: int, world_size: int, files: dict[str, bytes]) -> None:
    """One rank's part of a checkpoint, as ``save_checkpoint`` leaves it: its files, then its manifest."""
    for name, data in files.items():
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_bytes(data)
    write_manifest(directory, rank=rank, world_size=world_size)


def two_rank_checkpoint(parent: Path, name: str, payload: bytes = b"weights") -> Path:
    """Two ranks write their parts into their own folders; they are merged into one, as Ray Train does."""
    target = parent / name
    for rank, files in enumerate(
        [{"model.pt": payload, "ranks/rank-00000.pt": b"rng0"}, {"ranks/rank-00001.pt": b"rng1"}]
    ):
        part = parent / f"part-{name}-{rank}"
        part.mkdir(parents=True)
        write_part(part, rank, 2, files)
        shutil.copytree(part, target, dirs_exist_ok=True)
        shutil.rmtree(part)
    return target


# --- verification ------------------------------------------------------------------------------------


def test_a_whole_checkpoint_verifies(tmp_path):
    checkpoint = two_rank_checkpoint(tmp_path, "checkpoint_1")
    manifests = sorted(p.name for p in (checkpoint / "manifests").iterdir())
    assert manifests == ["rank-00000.json", "rank-00001.json"]
    rank0 = json.loads((checkpoint / "manifests" / "rank-00000.json").read_text())
    assert rank0["world_size"] == 2 and rank0["files"]["model.pt"]["size"] == len(b"weights")
    assert set(rank0["files"]) == {"model.pt", "ranks/rank-00000.pt"}  # only its own files

    result = verify_checkpoint(checkpoint)
    assert result and result.problem == ""
    assert (result.world_size, result.files, result.size_bytes) == (2, 3, len(b"weights") + 8)
    # Any pyarrow filesystem: a URI, or a filesystem and a path on it.
    assert verify_checkpoint(f"file://{checkpoint}")
    assert verify_checkpoint(str(checkpoint), pyarrow.fs.LocalFileSystem())


def test_a_truncated_file_fails(tmp_path):
    checkpoint = two_rank_checkpoint(tmp_path, "checkpoint_1")
    (checkpoint / "model.pt").write_bytes(b"wei")
    result = verify_checkpoint(checkpoint, checksums=False)
    assert not result and result.problem == "model.pt is 3 bytes, its manifest says 7"


def test_a_missing_file_fails(tmp_path):
    checkpoint = two_rank_checkpoint(tmp_path, "checkpoint_1")
    (checkpoint / "ranks" / "rank-00001.pt").unlink()
    assert verify_checkpoint(checkpoint).problem == "ranks/rank-00001.pt is missing"


def test_a_missing_rank_manifest_fails(tmp_path):
    checkpoint = two_rank_checkpoint(tmp_path, "checkpoint_1")
    (checkpoint / "manifests" / "rank-00001.json").unlink()
    result = verify_checkpoint(checkpoint)
    assert not result and "no manifest from rank(s) 1 of 2" in result.problem


def test_a_wrong_checksum_fails_when_checksums_are_read(tmp_path):
    checkpoint = two_rank_checkpoint(tmp_path, "checkpoint_1")
    (checkpoint / "model.pt").write_bytes(b"WEIGHTS")  # same size, other bytes
    assert verify_checkpoint(checkpoint, checksums=False)  # sizes alone can't tell
    assert verify_checkpoint(checkpoint).problem == "model.pt does not match its SHA-256"


def test_without_any_manifest_a_checkpoint_is_invalid(tmp_path):
    checkpoint = tmp_path / "checkpoint_1"
    checkpoint.mkdir()
    (checkpoint / "model.pt").write_bytes(b"weights")
    assert "no manifest" in verify_checkpoint(checkpoint).problem
    assert verify_checkpoint(tmp_path / "checkpoint_2").problem == "the checkpoint folder does not exist"
    (checkpoint / "manifests").mkdir()
    (checkpoint / "manifests" / "rank-00000.json").write_text("{not json")
    assert "rank-00000.json is unreadable" in verify_checkpoint(checkpoint).problem


def test_manifests_that_disagree_on_the_world_size_fail(tmp_path):
    checkpoint = tmp_path / "checkpoint_1"
    checkpoint.mkdir()
    write_part(checkpoint, 0, 2, {"a.pt": b"a"})
    write_part(checkpoint, 1, 3, {"b.pt": b"b"})
    assert "disagree on the world size" in verify_checkpoint(checkpoint).problem


# --- the training loop writes them ------------------------------------------------------------------


def test_every_checkpoint_the_loop_writes_verifies_and_lists_its_files(tmp_path):
    ctx = LocalContext(tmp_path)
    run_training(job_config(MLP, workers=1, epochs=2), ctx, RecordingReporter())
    assert len(ctx.checkpoints) == 2
    for checkpoint in ctx.checkpoints:
        result = verify_checkpoint(checkpoint)
        assert result, result.problem
        listed = json.loads((checkpoint / "manifests" / "rank-00000.json").read_text())["files"]
        on_disk = {p.relative_to(checkpoint).as_posix() for p in checkpoint.rglob("*") if p.is_file()}
        assert set(listed) == on_disk - {"manifests/rank-00000.json"}
    # The loop's metrics (keep_best's defaults) are exactly the ones a classifier's epoch checkpoint carries.
    assert set(CHECKPOINT_METRICS) == set(ctx.reported[-1]) - {"epoch", "step"}


def test_two_ranks_write_a_manifest_each_into_the_merged_checkpoint(tmp_path):
    config = job_config(MLP, workers=2, epochs=1)
    [rank0, _] = run_on_ranks([(train, {"config": config, "root": tmp_path / "run"})], tmp_path)
    [checkpoint] = rank0[0]["checkpoints"]
    assert sorted(p.name for p in (Path(checkpoint) / "manifests").iterdir()) == ["rank-00000.json", "rank-00001.json"]
    assert verify_checkpoint(checkpoint).world_size == 2


# --- resuming only from a whole checkpoint --------------------------------------------------------


def test_resume_falls_back_to_the_newest_whole_checkpoint(tmp_path, caplog):
    run = tmp_path / "run"
    older = two_rank_checkpoint(run, "checkpoint_2026-01-01_10-00-00.000001", b"older")
    middle = two_rank_checkpoint(run, "checkpoint_2026-01-01_11-00-00.000001", b"middle")
    latest = two_rank_checkpoint(run, "checkpoint_2026-01-01_12-00-00.000001", b"latest")
    (run / "checkpoint_manager_snapshot.json").write_text("{}")  # other files of the run folder: ignored
    assert checkpoint_folders(run) == [str(latest), str(middle), str(older)]

    assert choose_resume_checkpoint(latest) == str(latest)

    (latest / "model.pt").write_bytes(b"LATEST")  # a corrupt latest
    (middle / "manifests" / "rank-00001.json").unlink()  # a save cut short
    with caplog.at_level(logging.WARNING, logger="workers.runtime.manifest"):
        assert choose_resume_checkpoint(latest) == str(older)
    [warning] = [r.getMessage() for r in caplog.records]
    assert f"not resuming from checkpoint {latest}: model.pt does not match its SHA-256" in warning
    assert f"resuming from {older}" in warning

    (older / "model.pt").unlink()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="workers.runtime.manifest"):
        assert choose_resume_checkpoint(latest) is None
    assert "starting from scratch" in caplog.records[0].getMessage()
    assert newest_verified_checkpoint(run) is None


def test_local_context_resumes_only_from_a_whole_checkpoint(tmp_path):
    first = LocalContext(tmp_path / "first")
    config = job_config(MLP, workers=1, epochs=3)
    run_training(config, first, RecordingReporter())
    _epoch1, epoch2, epoch3 = first.checkpoints
    (epoch3 / "train_state.pt").write_bytes((epoch3 / "train_state.pt").read_bytes()[:-1])  # cut short
    assert latest_checkpoint(tmp_path / "first") == epoch2

    resumed = LocalContext(tmp_path / "again", resume_from=epoch3)
    run_training(config, resumed, RecordingReporter())
    assert [r["epoch"] for r in resumed.reported] == [3]  # from epoch 2's checkpoint, not 3's nor scratch


# --- only whole checkpoints are reported --------------------------------------------------------------


def test_an_incomplete_checkpoint_is_not_reported(tmp_path, caplog):
    checkpoint = two_rank_checkpoint(tmp_path, "checkpoint_1")
    metrics = {"epoch": 1, "step": 10, "val_accuracy": 0.5}
    event = checkpoint_event(Checkpoint.from_directory(str(checkpoint)), metrics, storage_path=str(tmp_path))
    assert event is not None and event.path == str(checkpoint) and event.metrics == {"val_accuracy": 0.5}

    (checkpoint / "manifests" / "rank-00001.json").unlink()
    with caplog.at_level(logging.WARNING, logger="workers.train.callbacks"):
        assert checkpoint_event(Checkpoint.from_directory(str(checkpoint)), metrics, str(tmp_path)) is None
    assert "not recording checkpoint" in caplog.text and "no manifest from rank(s) 1" in caplog.text


# --- Ray Train's run snapshot after retention deleted checkpoints -----------------------------------


def _ray_snapshot(storage: Path, run: str, names: list[str]) -> None:
    """The snapshot Ray Train 2.60 writes after registering ``names`` in order (its own models)."""
    from workers.train.ray_internals import CheckpointManagerState, TrainingResultState

    results = [TrainingResultState(checkpoint_dir_name=n, metrics={"step": i}) for i, n in enumerate(names)]
    state = CheckpointManagerState(
        checkpoint_results=results,
        checkpoint_report_indices=list(range(len(names))),
        latest_checkpoint_result=results[-1],
        pending_training_results=[],
        pending_validation_specs=[],
        current_report_index=len(names),
        validated_checkpoint_dir_names=[],
        timed_out_validation_checkpoint_dir_names=[],
        failed_validation_checkpoint_dir_names=[],
    )
    (storage / run / SNAPSHOT_FILE).write_text(state.model_dump_json())


def _ray_loads_snapshot(storage: Path, run: str):
    """What a new TorchTrainer of the run does first: load its checkpoint manager from the snapshot."""
    from ray.train import CheckpointConfig

    from workers.train.ray_internals import CheckpointManager, StorageContext

    context = StorageContext(storage_path=str(storage), experiment_dir_name=run)
    return CheckpointManager(checkpoint_config=CheckpointConfig(), storage_context=context)


def test_ray_is_told_which_checkpoints_retention_deleted(tmp_path):
    from workers.train.ray_internals import CheckpointManagerInitializationError

    names = ["checkpoint_a", "checkpoint_b", "checkpoint_c"]
    for name in names:
        (tmp_path / "job" / name).mkdir(parents=True)
    _ray_snapshot(tmp_path, "job", names)
    assert forget_deleted_checkpoints(str(tmp_path), "job") == []  # nothing deleted: left as it is

    shutil.rmtree(tmp_path / "job" / "checkpoint_a")
    shutil.rmtree(tmp_path / "job" / "checkpoint_c")  # the latest, say swept as never recorded
    with pytest.raises(CheckpointManagerInitializationError, match="does not exist anymore"):
        _ray_loads_snapshot(tmp_path, "job")

    assert forget_deleted_checkpoints(str(tmp_path), "job") == ["checkpoint_a", "checkpoint_c"]
    manager = _ray_loads_snapshot(tmp_path, "job")
    assert manager.latest_checkpoint_result.checkpoint.path == str(tmp_path / "job" / "checkpoint_b")
    assert [r.checkpoint.path for r in manager.best_checkpoint_results] == [str(tmp_path / "job" / "checkpoint_b")]


def test_a_run_without_a_snapshot_is_left_alone(tmp_path):
    assert forget_deleted_checkpoints(str(tmp_path), "job") == []
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / SNAPSHOT_FILE).write_text('{"something": "else"}')
    assert forget_deleted_checkpoints(str(tmp_path), "job") == []
    assert (tmp_path / "job" / SNAPSHOT_FILE).read_text() == '{"something": "else"}'
