"""Checkpoint retention and the orphan sweeper on the control plane, against real folders in a temporary
storage and a real database (SQLite and PostgreSQL), over a fake cluster."""

from __future__ import annotations

import os
import shutil
import time
from datetime import timedelta
from pathlib import Path

import pytest
from pydantic import ValidationError

from orchestrator.backend import RunStatus
from orchestrator.checkpoint_policy import RecordedCheckpoint, select_kept
from orchestrator.db.models import Checkpoint, Job, utcnow
from orchestrator.loops.scheduler import Scheduler
from orchestrator.storage import CheckpointStorage, StorageError
from orchestrator_contract.jobs import JobSpec, KeepBestSpec
from tests.unit.api_helpers import ADMIN, driver_exits, run_token
from workers.runtime.manifest import verify_checkpoint, write_manifest

HEADERS = {"Authorization": f"Bearer {ADMIN}"}


# --- what retention keeps (no database) ---------------------------------------------------------------


def recorded(*accuracies: float | None) -> list[RecordedCheckpoint]:
    """Checkpoints 1..n in the order they were recorded, with val_accuracy (None: a mid-epoch one)."""
    return [
        RecordedCheckpoint(i, f"/s/checkpoint_{i}", 10 * i, {} if a is None else {"val_accuracy": a, "val_loss": 1 - a})
        for i, a in enumerate(accuracies, start=1)
    ]


def test_retention_keeps_the_newest():
    assert select_kept(recorded(0.1, 0.2, 0.3, 0.4), 2, None) == {3, 4}
    assert select_kept(recorded(0.1), 3, None) == {1}
    assert select_kept([], 2, None) == set()


def test_retention_keeps_the_newest_and_the_best():
    checkpoints = recorded(0.5, 0.9, None, 0.7, 0.8, 0.6)
    assert select_kept(checkpoints, 2, KeepBestSpec(metric="val_accuracy", count=1)) == {2, 5, 6}
    assert select_kept(checkpoints, 2, KeepBestSpec(metric="val_accuracy", count=3)) == {2, 4, 5, 6}
    assert select_kept(checkpoints, 1, KeepBestSpec(metric="val_loss", count=1)) == {2, 6}  # mode min by default
    assert select_kept(checkpoints, 1, KeepBestSpec(metric="val_accuracy", mode="min", count=1)) == {1, 6}


def test_checkpoints_without_the_metric_never_count_as_best_and_the_latest_is_always_kept():
    checkpoints = recorded(0.9, None, None)  # the latest two are mid-epoch: no metrics
    assert select_kept(checkpoints, 1, KeepBestSpec(metric="val_accuracy", count=5)) == {1, 3}
    checkpoints[0] = RecordedCheckpoint(1, "/s/checkpoint_1", 10, {"val_accuracy": float("nan")})
    assert select_kept(checkpoints, 1, KeepBestSpec(metric="val_accuracy")) == {3}


def test_ties_go_to_the_newer():
    assert select_kept(recorded(0.9, 0.9, 0.1), 1, KeepBestSpec(metric="val_accuracy")) == {2, 3}


# --- the service ------------------------------------------------------------------------------------


@pytest.fixture
def storage(tmp_path) -> Path:
    path = tmp_path / "storage"
    path.mkdir()
    return path


@pytest.fixture
def settings_overrides(storage) -> dict:
    return {"storage": str(storage), "checkpoint_orphan_grace_s": 600, "workload_packages": ""}


def start_job(app, backend, **spec) -> tuple[str, str]:
    """A job the scheduler has admitted: (job id, its driver's token)."""
    response = app.state.client.post("/v1/jobs", json={"workload": "digits", **spec}, headers=HEADERS)
    assert response.status_code == 201, response.text
    service = app.state.service
    Scheduler(service.sessions, service.backend, service.settings).tick()
    return response.json()["id"], run_token(app.state.client, backend)


def write_checkpoint(storage: Path, job_id: str, name: str) -> Path:
    """A whole checkpoint folder, as Ray Train leaves one in the job's run folder."""
    folder = storage / job_id / name
    folder.mkdir(parents=True)
    (folder / "model.pt").write_bytes(b"weights of " + name.encode())
    write_manifest(folder, rank=0, world_size=1)
    return folder


def age(folder: Path, seconds: float) -> None:
    then = time.time() - seconds
    for path in [folder, *folder.rglob("*")]:
        os.utime(path, (then, then))


def post_events(client, job_id: str, token: str, *events: dict) -> None:
    batch = {"attempt": 1, "events": list(events)}
    response = client.post(
        f"/internal/v1/jobs/{job_id}/events", json=batch, headers={"Authorization": f"Bearer {token}"}
    )
    assert response.status_code == 200, response.text


def record_after_the_end(app, job_id: str, folder: Path, step: int, **metrics: float) -> None:
    """A checkpoint recorded after the job ended, straight into the database: its driver's token stopped
    working when the job ended, so no event can record one any more; a row from before that rule (or one a
    test needs) is recorded here, then retention runs as the events endpoint would run it."""
    with app.state.service.sessions.begin() as session:
        session.add(
            Checkpoint(job_id=job_id, attempt=1, epoch=step, step=step, path=str(folder), size_bytes=1, metrics=metrics)
        )
    app.state.service.checkpoints.after_recording(job_id)


def checkpoint_event(folder: Path, step: int, **metrics: float) -> dict:
    return {"type": "checkpoint", "epoch": step, "step": step, "path": str(folder), "size_bytes": 1, "metrics": metrics}


def listed(client, job_id: str) -> list[str]:
    return [Path(c["path"]).name for c in client.get(f"/v1/jobs/{job_id}/checkpoints", headers=HEADERS).json()]


def stored(storage: Path, job_id: str) -> list[str]:
    # Folders only: Ray's checkpoint_manager_snapshot.json starts with "checkpoint_" too.
    return sorted(p.name for p in (storage / job_id).glob("checkpoint_*") if p.is_dir())


def test_keep_best_is_validated_and_filled_in(client):
    job = client.post(
        "/v1/jobs", json={"workload": "digits", "checkpoint": {"keep_best": {"metric": "val_loss"}}}, headers=HEADERS
    ).json()
    assert job["spec"]["checkpoint"]["keep_best"] == {"metric": "val_loss", "mode": "min", "count": 1}
    assert (
        client.post("/v1/jobs", json={"workload": "digits"}, headers=HEADERS).json()["spec"]["checkpoint"]["keep_best"]
        is None
    )
    for keep_best, field, message in [
        ({"metric": "val_accuracy", "count": 0}, "count", "greater than or equal to 1"),
        ({"metric": "val_accuracy", "mode": "highest"}, "mode", "'max' or 'min'"),
        ({"metric": "val mae", "mode": "min"}, "metric", "no spaces or control characters"),
        ({"metric": "x" * 65, "mode": "min"}, "metric", "65 characters: at most 64"),
        ({"mode": "max"}, "metric", "Field required"),
        ({"metric": "val_loss", "extra": 1}, "extra", "Extra inputs are not permitted"),
    ]:
        response = client.post(
            "/v1/jobs", json={"workload": "digits", "checkpoint": {"keep_best": keep_best}}, headers=HEADERS
        )
        assert response.status_code == 422, response.text
        [detail] = response.json()["detail"]
        assert detail["loc"] == ["body", "checkpoint", "keep_best", field] and message in detail["msg"], detail


def test_keep_best_may_name_any_metric_the_workload_reports_with_its_mode(client):
    def keep_best(workload: str, **fields) -> dict:
        response = client.post(
            "/v1/jobs", json={"workload": workload, "checkpoint": {"keep_best": fields}}, headers=HEADERS
        )
        return response

    # A metric only the workload's code knows (its own Workload.metrics): the spec says which way is better.
    kept = JobSpec(workload="pkg.train:build", checkpoint={"keep_best": {"metric": "val_mae", "mode": "min"}})
    assert kept.checkpoint.keep_best.model_dump() == {"metric": "val_mae", "mode": "min", "count": 1}
    # Without mode: a 422 saying so (before the package is found not allowed here: the spec is checked first).
    response = keep_best("pkg.train:build", metric="val_mae")
    assert response.status_code == 422, response.text
    [detail] = response.json()["detail"]
    assert detail["loc"] == ["body", "checkpoint"], detail
    assert "mode is required for metric 'val_mae' (max or min)" in detail["msg"], detail
    # A registered workload's metrics are known before it runs: digits never reports val_mae (tests/unit/test_spec.py).
    assert keep_best("digits", metric="val_mae", mode="min").status_code == 422
    # A "package.module:function" workload declares no metrics of its own; the loop's keep their modes.
    with pytest.raises(ValidationError, match=r"mode is required for metric 'val_mae' \(max or min\)"):
        JobSpec(workload="pkg.train:build", checkpoint={"keep_best": {"metric": "val_mae"}})
    spec = JobSpec(workload="pkg.train:build", checkpoint={"keep_best": {"metric": "train_loss"}})
    assert spec.checkpoint.keep_best.mode == "min"


def test_retention_deletes_from_storage_and_then_the_database(app, client, backend, storage):
    job, token = start_job(app, backend, checkpoint={"keep": 2, "keep_best": {"metric": "val_accuracy"}})
    (storage / job).mkdir()
    (storage / job / "checkpoint_manager_snapshot.json").write_text("{}")  # Ray's: never touched
    accuracies = [0.5, 0.9, 0.7, 0.8, 0.6]
    for i, accuracy in enumerate(accuracies, start=1):
        folder = write_checkpoint(storage, job, f"checkpoint_{i}")
        post_events(client, job, token, checkpoint_event(folder, 10 * i, val_accuracy=accuracy))
    # The newest two and the best one, in the database and in storage alike, right after the events.
    assert listed(client, job) == stored(storage, job) == ["checkpoint_2", "checkpoint_4", "checkpoint_5"]
    assert (storage / job / "checkpoint_manager_snapshot.json").exists()
    assert all(verify_checkpoint(storage / job / name) for name in stored(storage, job))

    # A re-sent checkpoint is recorded once.
    post_events(client, job, token, checkpoint_event(storage / job / "checkpoint_5", 50, val_accuracy=0.6))
    assert listed(client, job) == ["checkpoint_2", "checkpoint_4", "checkpoint_5"]


def test_a_checkpoint_that_cannot_be_deleted_stays_recorded_until_it_is(app, client, backend, storage, monkeypatch):
    job, token = start_job(app, backend, checkpoint={"keep": 1})
    janitor = app.state.service.checkpoints
    delete = CheckpointStorage.delete_checkpoint

    def failing_delete(self, job_id, path):
        raise StorageError(f"cannot delete {path}: permission denied")

    first = write_checkpoint(storage, job, "checkpoint_1")
    post_events(client, job, token, checkpoint_event(first, 10))
    monkeypatch.setattr(CheckpointStorage, "delete_checkpoint", failing_delete)
    second = write_checkpoint(storage, job, "checkpoint_2")
    post_events(client, job, token, checkpoint_event(second, 20))  # retention fails after the commit: logged
    assert listed(client, job) == stored(storage, job) == ["checkpoint_1", "checkpoint_2"]

    monkeypatch.setattr(CheckpointStorage, "delete_checkpoint", delete)
    janitor.tick()  # the loop tries again
    assert listed(client, job) == stored(storage, job) == ["checkpoint_2"]


def test_the_sweeper_deletes_orphans_after_the_grace_and_at_once_when_the_job_ended(app, client, backend, storage):
    job, token = start_job(app, backend, checkpoint={"keep": 3})
    janitor = app.state.service.checkpoints
    registered = write_checkpoint(storage, job, "checkpoint_1")
    post_events(client, job, token, {"type": "state", "state": "running"}, checkpoint_event(registered, 10))
    age(registered, 3600)  # old, but recorded: kept
    old_orphan = write_checkpoint(storage, job, "checkpoint_2")  # Ray wrote it, nobody recorded it
    age(old_orphan, 601)
    young_orphan = storage / job / "checkpoint_3"  # still being written
    young_orphan.mkdir()
    (young_orphan / "model.pt").write_bytes(b"half")
    gone = write_checkpoint(storage, job, "checkpoint_4")
    post_events(client, job, token, checkpoint_event(gone, 40))
    (storage / job / "checkpoint_manager_snapshot.json").write_text("{}")
    (storage / job / "notes").mkdir()
    shutil.rmtree(gone)  # deleted behind the service's back

    janitor.tick()
    assert stored(storage, job) == ["checkpoint_1", "checkpoint_3"]
    assert listed(client, job) == ["checkpoint_1"]  # the record of the vanished folder is forgotten
    assert (storage / job / "checkpoint_manager_snapshot.json").exists() and (storage / job / "notes").is_dir()

    janitor.tick()
    assert stored(storage, job) == ["checkpoint_1", "checkpoint_3"]  # the grace holds while the job runs

    post_events(client, job, token, {"type": "state", "state": "succeeded"})
    driver_exits(app, backend)  # the job ends once Ray says so
    janitor.tick()
    assert listed(client, job) == stored(storage, job) == ["checkpoint_1"]


def test_the_first_sweep_covers_jobs_that_ended_long_ago(app, client, backend, storage):
    job, token = start_job(app, backend)
    folder = write_checkpoint(storage, job, "checkpoint_1")
    post_events(client, job, token, checkpoint_event(folder, 10), {"type": "state", "state": "failed"})
    driver_exits(app, backend, status=RunStatus.FAILED, exit_code=3)  # Ray confirms the reported failure
    with app.state.service.sessions.begin() as session:  # it ended while the service was down, say
        ended = session.get(Job, job)
        ended.finished_at = utcnow() - timedelta(days=2)
    write_checkpoint(storage, job, "checkpoint_2")
    janitor = app.state.service.checkpoints
    janitor.tick()
    assert stored(storage, job) == listed(client, job) == ["checkpoint_1"]
    # Later ticks look only at active jobs and those that ended in the last hour.
    write_checkpoint(storage, job, "checkpoint_3")
    janitor.tick()
    assert stored(storage, job) == ["checkpoint_1", "checkpoint_3"]


def test_paths_outside_the_run_folder_are_never_deleted(app, client, backend, storage, tmp_path):
    job, token = start_job(app, backend, checkpoint={"keep": 1})
    elsewhere = tmp_path / "elsewhere" / "checkpoint_1"
    elsewhere.mkdir(parents=True)
    # A driver may not record it (400, nothing recorded); a row from before a change of the storage setting
    # may still name such a folder.
    refused = client.post(
        f"/internal/v1/jobs/{job}/events",
        json={"attempt": 1, "events": [checkpoint_event(elsewhere, 10)]},
        headers={"Authorization": f"Bearer {token}"},
    )
    assert refused.status_code == 400 and "is not a checkpoint_* folder of job" in refused.json()["detail"]
    assert listed(client, job) == []
    with app.state.service.sessions.begin() as session:
        session.add(Checkpoint(job_id=job, attempt=1, epoch=10, step=10, path=str(elsewhere), size_bytes=1, metrics={}))
    inside = write_checkpoint(storage, job, "checkpoint_2")
    post_events(client, job, token, checkpoint_event(inside, 20))
    assert elsewhere.is_dir()
    assert listed(client, job) == ["checkpoint_1", "checkpoint_2"]  # left alone, with a warning
    storage_view = app.state.service.storages.of(None)  # the default cluster's
    with pytest.raises(ValueError, match="not a checkpoint folder of job"):
        storage_view.delete_checkpoint(job, str(elsewhere))
    with pytest.raises(ValueError):
        storage_view.delete_checkpoint(job, str(storage / job))
    with pytest.raises(ValueError):
        storage_view.delete_checkpoint(
            job, str(storage / job / "checkpoint_2" / ".." / ".." / "other" / "checkpoint_9")
        )


def test_storage_speaks_uris():
    s3 = CheckpointStorage("s3://bucket/runs/")
    assert s3.to_fs_path("s3://bucket/runs/job/checkpoint_1") == "bucket/runs/job/checkpoint_1"
    assert s3.to_fs_path("/local/runs/job/checkpoint_1") is None  # another storage: not ours
    assert s3.to_recorded("bucket/runs/job/checkpoint_1") == "s3://bucket/runs/job/checkpoint_1"
    local = CheckpointStorage("/data/runs")
    assert local.to_fs_path("s3://bucket/runs/job/checkpoint_1") is None
    assert local.checkpoint_name("job", "/data/runs/job/checkpoint_1") == "checkpoint_1"
    assert local.checkpoint_name("job", "/data/runs/job/checkpoint_1/") == "checkpoint_1"
    assert local.checkpoint_name("job", "/data/runs/other/checkpoint_1") is None
    assert local.checkpoint_name("job", "/data/runs/job/notes") is None


# --- checkpoints that deployments serve ------------------------------------------------------------------


def deploy(client, name: str, **source) -> dict:
    response = client.post("/v1/deployments", json={"name": name, "source": source}, headers=HEADERS)
    assert response.status_code == 201, response.text
    return response.json()


def finished_with_one_checkpoint(app, client, backend, storage) -> tuple[str, str]:
    """A digits job (keep 1) that ended with checkpoint_1 recorded: (job id, its driver's token)."""
    job, token = start_job(app, backend, checkpoint={"keep": 1})
    first = write_checkpoint(storage, job, "checkpoint_1")
    running = {"type": "state", "state": "running"}
    post_events(client, job, token, running, checkpoint_event(first, 10, val_accuracy=0.9))
    post_events(client, job, token, {"type": "state", "state": "succeeded"})
    driver_exits(app, backend)
    return job, token


def test_retention_never_deletes_a_checkpoint_a_live_deployment_references(app, client, backend, storage):
    job, token = finished_with_one_checkpoint(app, client, backend, storage)
    served = deploy(client, "served", job_id=job)
    assert Path(served["target"]["checkpoint_path"]).name == "checkpoint_1"
    janitor = app.state.service.checkpoints

    # A newer checkpoint is recorded: with keep 1 the policy now drops checkpoint_1, which the deployment
    # serves. (An ended job's driver can no longer report one: its token ended with the job.)
    second = write_checkpoint(storage, job, "checkpoint_2")
    assert (
        client.post(
            f"/internal/v1/jobs/{job}/events",
            json={"attempt": 1, "events": [checkpoint_event(second, 20)]},
            headers={"Authorization": f"Bearer {token}"},
        ).status_code
        == 401
    )
    record_after_the_end(app, job, second, 20, val_accuracy=0.8)
    assert listed(client, job) == stored(storage, job) == ["checkpoint_1", "checkpoint_2"]
    janitor.tick()
    assert listed(client, job) == stored(storage, job) == ["checkpoint_1", "checkpoint_2"]

    # A new version serves checkpoint_2; version 1 (what a rollback returns to) still holds checkpoint_1.
    checkpoint_2 = client.get(f"/v1/jobs/{job}/checkpoints", headers=HEADERS).json()[-1]["id"]
    patched = client.patch("/v1/deployments/served", json={"source": {"checkpoint_id": checkpoint_2}}, headers=HEADERS)
    assert patched.status_code == 200, patched.text
    janitor.tick()
    assert janitor.enforce_retention(job) == []
    assert listed(client, job) == stored(storage, job) == ["checkpoint_1", "checkpoint_2"]
    assert client.post("/v1/deployments/served/rollback", headers=HEADERS).status_code == 200  # its folder is there

    # Deleted: the next pass applies the policy.
    assert client.delete("/v1/deployments/served", headers=HEADERS).status_code == 200
    janitor.tick()
    assert listed(client, job) == stored(storage, job) == ["checkpoint_2"]


def test_a_deleted_deployment_releases_checkpoints_of_a_job_that_ended_long_ago(app, client, backend, storage):
    job, _token = finished_with_one_checkpoint(app, client, backend, storage)
    deploy(client, "old", job_id=job)
    record_after_the_end(app, job, write_checkpoint(storage, job, "checkpoint_2"), 20)
    with app.state.service.sessions.begin() as session:
        session.get(Job, job).finished_at = utcnow() - timedelta(days=2)
    janitor = app.state.service.checkpoints
    janitor.tick()  # the first tick visits every job
    janitor.tick()  # later ones only active and recently finished jobs...
    assert listed(client, job) == stored(storage, job) == ["checkpoint_1", "checkpoint_2"]

    assert client.delete("/v1/deployments/old", headers=HEADERS).status_code == 200
    janitor.tick()  # ...and those whose checkpoints deployments stopped referencing
    assert listed(client, job) == stored(storage, job) == ["checkpoint_2"]


def test_the_sweeper_never_deletes_a_folder_a_live_deployment_references(app, client, backend, storage, monkeypatch):
    job, _ = finished_with_one_checkpoint(app, client, backend, storage)
    deploy(client, "served", job_id=job)
    janitor = app.state.service.checkpoints
    janitor.tick()
    assert listed(client, job) == stored(storage, job) == ["checkpoint_1"]

    # A listing that missed the folder once: its record is forgotten, so the folder is unrecorded now,
    # and the job has ended (unrecorded folders of an ended job go at once).
    list_checkpoints = CheckpointStorage.list_checkpoints
    monkeypatch.setattr(CheckpointStorage, "list_checkpoints", lambda self, job_id: {})
    janitor.tick()
    monkeypatch.setattr(CheckpointStorage, "list_checkpoints", list_checkpoints)
    assert listed(client, job) == []
    janitor.tick()
    assert janitor.sweep(job, finished=True) == ([], [])
    assert stored(storage, job) == ["checkpoint_1"]  # the deployment's replicas load it from there

    assert client.delete("/v1/deployments/served", headers=HEADERS).status_code == 200
    janitor.tick()
    assert stored(storage, job) == []
