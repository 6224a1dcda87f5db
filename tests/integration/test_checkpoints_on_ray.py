"""Checkpoints that can be trusted, on a real Ray cluster: after a run, storage and the database list
exactly the same checkpoints (retention by keep and keep_best, the orphan sweeper), and each verifies."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from workers.runtime.manifest import verify_checkpoint

pytestmark = pytest.mark.integration


def _recorded(member, job_id: str) -> list[dict]:
    return member.http.get(f"/v1/jobs/{job_id}/checkpoints").json()


def _stored(run_dir: Path) -> list[str]:
    return sorted(str(p) for p in run_dir.glob("checkpoint_*") if p.is_dir())


def test_storage_and_the_database_list_the_same_whole_checkpoints(member):
    # keep_best on the highest train_loss: epoch 1's, so "best" and "newest" are different checkpoints.
    checkpoint = {"keep": 2, "keep_best": {"metric": "train_loss", "mode": "max", "count": 1}}
    response = member.submit(name="retention", epochs=5, checkpoint=checkpoint)
    assert response.status_code == 201, response.text
    job_id = response.json()["id"]

    deadline = time.monotonic() + 180
    while not (recorded := _recorded(member, job_id)):
        assert time.monotonic() < deadline, "no checkpoint was recorded"
        assert member.job(job_id)["state"] in ("QUEUED", "STARTING", "RUNNING"), member.job(job_id)
        time.sleep(0.5)
    run_dir = Path(recorded[0]["path"]).parent
    assert run_dir.name == job_id
    # A folder Ray Train started but never registered, as a crash mid-save leaves one.
    orphan = run_dir / "checkpoint_2000-01-01_00-00-00.000000"
    orphan.mkdir()
    (orphan / "model.pt").write_bytes(b"half a model")

    job = member.wait(job_id, {"SUCCEEDED"}, timeout_s=300)
    recorded = _recorded(member, job_id)
    assert [c["epoch"] for c in recorded] == [1, 4, 5]  # the best by the metric, and the newest two
    paths = sorted(c["path"] for c in recorded)
    for c in recorded:
        verification = verify_checkpoint(c["path"])
        assert verification and verification.world_size == 2, verification.problem
    assert job["result"]["checkpoint_path"] == recorded[-1]["path"]
    # Retention was applied before the job was reported finished: the rest of storage is the orphan
    # (which the sweeper may already have taken).
    assert sorted(set(_stored(run_dir)) - {str(orphan)}) == paths

    deadline = time.monotonic() + 60  # the sweeper runs every checkpoint_sweep_interval_s (10 s)
    while orphan.exists():
        assert time.monotonic() < deadline, "the orphaned folder was not swept"
        time.sleep(0.5)
    assert _stored(run_dir) == paths == sorted(c["path"] for c in _recorded(member, job_id))
    assert (run_dir / "checkpoint_manager_snapshot.json").is_file()  # Ray's own files stay
    # The job's token (jtk_...) travels in its driver's environment and Train's loop config: nothing Ray or the
    # service wrote to storage (snapshots, checkpoints, archived logs) may hold one.
    holding = [str(p) for p in run_dir.rglob("*") if p.is_file() and b"jtk_" in p.read_bytes()]
    assert holding == [], holding


def test_tied_epochs_keep_the_newest_and_best_deploys_it(member, ray_cluster):
    """Ties go to the newer checkpoint in retention and in "best" alike: with keep 1 and keep_best 1, a job
    whose epochs all tie (a rate of 1e-9 moves no prediction) keeps only its last checkpoint, and "best"
    names that one, which exists."""
    from tests.integration.conftest import remove_serving

    checkpoint = {"keep": 1, "keep_best": {"metric": "val_accuracy", "count": 1}}
    response = member.submit(
        name="tie",
        epochs=3,
        checkpoint=checkpoint,
        lr={"base": 1e-9},
        scaling={"num_workers": 1, "cpus_per_worker": 0.9},
    )
    assert response.status_code == 201, response.text
    job_id = response.json()["id"]
    member.wait(job_id, {"SUCCEEDED"}, timeout_s=300)
    accuracies = {
        p["values"]["val_accuracy"]
        for p in member.http.get(f"/v1/jobs/{job_id}/metrics").json()
        if "val_accuracy" in p["values"]
    }
    assert len(accuracies) == 1, accuracies  # a certain tie
    recorded = _recorded(member, job_id)
    assert [c["epoch"] for c in recorded] == [3]
    assert _stored(Path(recorded[0]["path"]).parent) == [recorded[0]["path"]]
    response = member.http.post("/v1/deployments", json={"name": "job-tie", "source": {"job_id": job_id}})
    try:
        assert response.status_code == 201, response.text
        assert response.json()["target"]["checkpoint_id"] == recorded[0]["id"]
    finally:
        remove_serving(member, ray_cluster, "job-tie")
