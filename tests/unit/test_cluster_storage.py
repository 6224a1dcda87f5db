"""A cluster's ``storage_root`` (docs/clusters.md, "Storage"): its runs' folders (checkpoints, archived logs) are
there, never on the service's own storage; a driver records checkpoints only there; retention deletes there; a
deployment serves a checkpoint only on a cluster that reads that storage; the root cannot change under live runs.
On fake clusters with real folders (the same Ray-side path as every other run)."""

from __future__ import annotations

from pathlib import Path

from orchestrator.db.models import Checkpoint
from orchestrator.loops.log_archive import LogArchiver
from orchestrator.states.jobs import lock_job, set_job_state
from orchestrator_contract.states import JobState
from tests.unit.api_helpers import ADMIN, auth, make_project, run_token, submit, tick
from tests.unit.test_checkpoint_retention import checkpoint_event, post_events, stored, write_checkpoint
from tests.unit.test_cluster_placement import bind, second, two_clusters  # noqa: F401  (fixtures)
from tests.unit.test_deployments import deploy

ONE_CPU = {"num_workers": 1, "cpus_per_worker": 1}


def give_b_a_root(client, root: Path) -> None:
    response = client.patch("/v1/clusters/b", json={"storage_root": str(root)}, headers=auth(ADMIN))
    assert response.status_code == 200, response.text


def admitted_on_b(app, client, root: Path) -> tuple[str, dict]:
    """b with its own root; a job of a project that may use b and the default cluster, admitted on b."""
    give_b_a_root(client, root)
    project_id, keys = make_project(client, "vision")
    bind(client, project_id, "b", "local")
    job_id = submit(client, keys["member"], scaling=ONE_CPU, placement={"cluster": "b"}).json()["id"]
    tick(app)
    return job_id, keys


def test_a_run_on_b_keeps_its_folder_on_bs_storage_root_only(two_clusters, client, second, tmp_path):  # noqa: F811
    root = tmp_path / "b-storage"
    give_b_a_root(client, root)
    project_id, keys = make_project(client, "vision")
    bind(client, project_id, "b")
    job_id = submit(client, keys["member"], scaling=ONE_CPU, checkpoint={"keep": 1}).json()["id"]
    tick(two_clusters)
    token = run_token(client, second)
    assignment = client.get(f"/internal/v1/jobs/{job_id}/assignment", params={"attempt": 1}, headers=auth(token))
    assert assignment.status_code == 200 and assignment.json()["storage_path"] == str(root)

    # A checkpoint on the service's own storage is not this run's folder any more: refused, nothing recorded.
    service_storage = Path(two_clusters.state.service.settings.storage_path)
    elsewhere = write_checkpoint(service_storage, job_id, "checkpoint_000000")
    batch = {"attempt": 1, "events": [checkpoint_event(elsewhere, 1)]}
    refused = client.post(f"/internal/v1/jobs/{job_id}/events", json=batch, headers=auth(token))
    assert refused.status_code == 400 and str(root / job_id) in refused.text, refused.text

    # On b's root: recorded, and retention (keep 1) deletes the older folder there.
    first, second_folder = (write_checkpoint(root, job_id, f"checkpoint_00000{i}") for i in (1, 2))
    post_events(client, job_id, token, checkpoint_event(first, 1))
    post_events(client, job_id, token, checkpoint_event(second_folder, 2))
    assert stored(root, job_id) == ["checkpoint_000002"]
    assert stored(service_storage, job_id) == ["checkpoint_000000"]  # not its folder: left alone

    # Its driver's output is archived next to its checkpoints.
    second.log_texts[f"{job_id}-1"] = "epoch 1 on b\n"
    service = two_clusters.state.service
    LogArchiver(service.sessions, service.backends, service.log_archive).tick()
    assert (root / job_id / "logs" / "attempt-0001.log").read_text() == "epoch 1 on b\n"
    assert not (service_storage / job_id / "logs").exists()


def test_the_root_does_not_change_under_live_runs(two_clusters, client, second, tmp_path):  # noqa: F811
    give_b_a_root(client, tmp_path / "first")
    project_id, keys = make_project(client, "vision")
    bind(client, project_id, "b")
    job_id = submit(client, keys["member"], scaling=ONE_CPU).json()["id"]
    tick(two_clusters)
    moved = client.patch("/v1/clusters/b", json={"storage_root": str(tmp_path / "second")}, headers=auth(ADMIN))
    assert moved.status_code == 409 and "1 run" in moved.text, moved.text
    assert client.post(f"/v1/jobs/{job_id}/cancel", headers=auth(ADMIN)).status_code == 200
    with two_clusters.state.service.sessions.begin() as session:
        set_job_state(session, lock_job(session, job_id), JobState.CANCELLED, "test")
    give_b_a_root(client, tmp_path / "second")


def test_a_checkpoint_is_served_only_where_its_storage_is_read(two_clusters, client, second, tmp_path):  # noqa: F811
    root = tmp_path / "b-storage"
    job_id, keys = admitted_on_b(two_clusters, client, root)
    folder = write_checkpoint(root, job_id, "checkpoint_000001")
    sessions = two_clusters.state.service.sessions
    with sessions.begin() as session:
        job = lock_job(session, job_id)
        for state in (JobState.RUNNING, JobState.SUCCEEDED):
            set_job_state(session, job, state, "test")
        checkpoint = Checkpoint(job_id=job_id, attempt=1, epoch=1, step=1, path=str(folder), size_bytes=1, metrics={})
        session.add(checkpoint)
        session.flush()
        checkpoint_id = checkpoint.id
    source = {"checkpoint_id": checkpoint_id}
    refused = deploy(client, keys["member"], name="on-local", source=source, placement={"cluster": "local"})
    assert refused.status_code == 422 and "storage_root" in refused.text and str(root) in refused.text, refused.text
    placed = deploy(client, keys["member"], name="anywhere", source=source)
    assert placed.status_code == 201 and placed.json()["cluster"] == "b", placed.text


def test_runs_of_a_deleted_cluster_are_still_kept_up_without_waiting_on_the_database(
    two_clusters,  # noqa: F811
    client,
    second,  # noqa: F811
    tmp_path,
):
    """Once b is deleted, its ended runs name a cluster the registry no longer knows: retention, the sweeper and
    the log archive look it up with no session of theirs open (on SQLite a second session of one thread would wait
    for the first one's lock, and fail after the busy timeout), and leave the folders on b's old root alone."""
    root = tmp_path / "b-storage"
    job_id, _ = admitted_on_b(two_clusters, client, root)
    token = run_token(client, second)
    folders = [write_checkpoint(root, job_id, f"checkpoint_00000{i}") for i in (1, 2)]
    for step, folder in enumerate(folders, start=1):
        post_events(client, job_id, token, checkpoint_event(folder, step))
    service = two_clusters.state.service
    with service.sessions.begin() as session:
        job = lock_job(session, job_id)
        set_job_state(session, job, JobState.RUNNING, "test")
        set_job_state(session, job, JobState.SUCCEEDED, "test")
    assert client.delete("/v1/clusters/b", headers=auth(ADMIN)).status_code == 204
    service.checkpoints.tick()
    service.checkpoints.enforce_retention(job_id)
    assert stored(root, job_id) == ["checkpoint_000001", "checkpoint_000002"]  # not on any storage it knows now
    assert client.get(f"/v1/jobs/{job_id}/checkpoints", headers=auth(ADMIN)).status_code == 200
    assert client.get(f"/v1/jobs/{job_id}/logs", headers=auth(ADMIN)).status_code == 200
