"""Real jobs on a real local Ray cluster (2 CPUs), submitted and watched over HTTP only."""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path

import pytest
import torch
from ray.job_submission import JobSubmissionClient

from orchestrator.backend.local_cluster import LocalRayCluster
from orchestrator.control_plane import ControlPlane
from orchestrator.settings import Settings
from orchestrator_contract.jobs import STARTUP_STAGES
from workers.train.checkpoints import load_model_from_checkpoint
from workers.workloads.digits import build

pytestmark = pytest.mark.integration


def _ray_submissions_of(cluster, job_id: str) -> list:
    client = JobSubmissionClient(cluster.dashboard_url, headers={"Authorization": f"Bearer {cluster.token()}"})
    return [j for j in client.list_jobs() if (j.metadata or {}).get("job_id") == job_id]


def _history(member, job_id: str) -> list[tuple[str | None, str, float]]:
    """The job's state changes as the control plane recorded them: (from, to, when as a Unix time)."""
    events = member.http.get(f"/v1/jobs/{job_id}/events").json()
    return [(e["from_state"], e["to_state"], datetime.fromisoformat(e["created_at"]).timestamp()) for e in events]


def _val_accuracy(model: torch.nn.Module, config: dict, seed: int) -> float:
    val = build(config, seed).val_dataset
    x = torch.stack([val[i][0] for i in range(len(val))])
    y = torch.stack([torch.as_tensor(val[i][1]) for i in range(len(val))])
    with torch.no_grad():
        return (model(x).argmax(dim=1) == y).float().mean().item()


def test_digits_job_trains_to_95_percent_and_reports_everything(member, ray_cluster):
    response = member.submit(name="digits-2w", scaling={"num_workers": 2}, labels={"suite": "integration"})
    assert response.status_code == 201, response.text
    job_id = response.json()["id"]

    running = member.wait(job_id, {"RUNNING", "SUCCEEDED"}, timeout_s=180)
    assert running["started_at"] is not None
    job = member.wait(job_id, {"SUCCEEDED"}, timeout_s=300)

    epochs = job["spec"]["epochs"]
    assert job["result"]["metrics"]["val_accuracy"] >= 0.95, job["result"]
    assert job["latest_metrics"]["val_accuracy"] >= 0.95

    metrics = member.http.get(f"/v1/jobs/{job_id}/metrics").json()
    per_epoch = [m for m in metrics if "val_accuracy" in m["values"]]
    assert [m["epoch"] for m in per_epoch] == list(range(1, epochs + 1))  # every epoch, once, in order
    assert all(m["attempt"] == 1 and {"train_loss", "val_loss"} <= m["values"].keys() for m in per_epoch)
    assert per_epoch[-1]["values"]["train_loss"] < per_epoch[0]["values"]["train_loss"]
    # Step metrics stream in between, every metrics_every_steps optimizer steps.
    steps = [m for m in metrics if "samples_per_s" in m["values"]]
    assert len(steps) >= per_epoch[-1]["step"] // job["spec"]["metrics_every_steps"] - epochs
    assert all(m["values"]["samples_per_s"] > 0 and m["values"]["lr"] > 0 for m in steps)

    checkpoints = member.http.get(f"/v1/jobs/{job_id}/checkpoints").json()
    assert len(checkpoints) == job["spec"]["checkpoint"]["keep"]
    assert checkpoints[-1]["epoch"] == epochs
    for checkpoint in checkpoints:
        assert Path(checkpoint["path"]).is_dir() and checkpoint["size_bytes"] > 0
    model = load_model_from_checkpoint(checkpoints[-1]["path"], "digits", job["spec"]["config"])
    assert _val_accuracy(model, job["spec"]["config"], job["spec"]["seed"]) >= 0.95

    events = member.http.get(f"/v1/jobs/{job_id}/events").json()
    # A rank slowed by the 2-core machine may be flagged a straggler (on_straggler: warn): a RUNNING -> RUNNING row.
    warned = [(e["from_state"], e["to_state"]) for e in events if e["reason"] == "straggler"]
    assert set(warned) <= {("RUNNING", "RUNNING")}, warned
    history = [(e["from_state"], e["to_state"]) for e in events if e["reason"] != "straggler"]
    assert history == [(None, "QUEUED"), ("QUEUED", "STARTING"), ("STARTING", "RUNNING"), ("RUNNING", "SUCCEEDED")]

    # Its start-up timeline (docs/jobs.md): every stage, from admitted first to first_step last. (Stages told by
    # different processes, the controller's workers_up and rank 0's training_started, may arrive either way round.)
    (startup,) = job["startup"]
    assert [s["stage"] for s in startup["stages"]] == list(STARTUP_STAGES), startup
    after = {s["stage"]: s["after_s"] for s in startup["stages"]}
    assert after["admitted"] == 0 and max(after.values()) == after["first_step"] == startup["first_step_s"], startup
    assert after["submitted"] <= after["driver_started"] <= after["assignment_fetched"] <= after["trainer_started"]
    assert after["training_started"] <= after["data_ready"] <= after["first_step"] < 120, startup

    # A finished job's follow returns everything its driver printed (it waits for the driver to exit) and ends.
    followed = member.http.get(f"/v1/jobs/{job_id}/logs", params={"follow": "true"}).text
    logs = member.http.get(f"/v1/jobs/{job_id}/logs").text
    assert job_id in logs and "RayTrainWorker" in logs  # driver output and forwarded worker output
    assert followed == logs
    _rays_log_tail_and_answers_read_as_the_backend_expects(ray_cluster, job_id)

    assert len(_ray_submissions_of(ray_cluster, job_id)) == 1
    _usage_matches_the_events(member, job, workers=2, cpus=1.0)


def _rays_log_tail_and_answers_read_as_the_backend_expects(cluster, job_id: str) -> None:
    """What a follow reads and how a lookup is classified (docs/security.md, "Reliability"), on the real
    dashboard: the tail of an ended run is its whole log, then ends; an unknown submission is MISSING, no log,
    and no tail."""
    import asyncio

    from orchestrator.backend import RunNotFound, RunStatus
    from orchestrator.backend.ray_backend import RayBackend

    backend = RayBackend(cluster.dashboard_url, cluster.token())

    async def tail(submission_id: str) -> str:
        return "".join([chunk.text async for chunk in backend.tail_logs(submission_id)])

    assert asyncio.run(tail(f"{job_id}-1")) == backend.logs(f"{job_id}-1")
    unknown = "f404" + job_id[4:] + "-1"  # "404" in an id says nothing: Ray's own answer does
    assert backend.info(unknown).status is RunStatus.MISSING and backend.logs(unknown) is None
    with pytest.raises(RunNotFound):
        asyncio.run(tail(unknown))


def _usage_matches_the_events(member, job: dict, workers: int, cpus: float) -> None:
    """Usage accounting (docs/usage.md): what an ended job held is workers x CPUs x the sum of its
    RUNNING intervals, read from its own history rows."""
    events = member.http.get(f"/v1/jobs/{job['id']}/events").json()
    running, since = 0.0, None
    for event in events:
        at = datetime.fromisoformat(event["created_at"])
        if event["to_state"] == "RUNNING" and since is None:
            since = at
        elif event["to_state"] not in ("RUNNING", "CANCELLING") and since is not None:
            running, since = running + (at - since).total_seconds(), None
    assert since is None and running > 0
    usage = member.http.get("/v1/usage", params={"group_by": "job", "from": job["created_at"]})
    assert usage.status_code == 200, usage.text
    row = next(row for row in usage.json()["rows"] if row["key"] == job["id"])
    # The ledger is written at the transitions' own instants: exact (to the millisecond it is rounded to).
    assert row["seconds"] == pytest.approx(running, abs=0.002)
    assert row["cpu_seconds"] == pytest.approx(workers * cpus * running, abs=0.01)
    assert row["memory_gb_seconds"] == pytest.approx(
        workers * job["spec"]["scaling"]["memory_per_worker_gb"] * running, abs=0.05
    )
    assert row["wasted_seconds"] == 0 and [a["ended"] for a in row["attempts"]] == ["SUCCEEDED"]


def test_queueing_cancel_and_idempotent_retry(member, ray_cluster):
    long_job = member.submit(name="long", epochs=500).json()["id"]
    member.wait(long_job, {"RUNNING"}, timeout_s=180)

    # The cluster is full: the next job waits, and says what for. A retried POST is the same job.
    retry = {"Idempotency-Key": "queued-job-1"}
    queued = member.submit(headers=retry, name="queued", epochs=2)
    again = member.submit(headers=retry, name="queued", epochs=2)
    assert queued.status_code == 201 and again.status_code == 200
    queued_id = queued.json()["id"]
    assert again.json()["id"] == queued_id
    time.sleep(2)  # several scheduler ticks
    waiting = member.job(queued_id)
    assert waiting["state"] == "QUEUED" and waiting["message"] == "waiting for resources: needs 2 CPU, 0 free"

    # Cancelling a queued job means it never starts.
    never = member.submit(name="never", epochs=2).json()["id"]
    assert member.http.post(f"/v1/jobs/{never}/cancel").json()["state"] == "CANCELLED"

    # Cancelling the running job stops it in Ray and frees the cluster: told from what Ray and the
    # control plane recorded (their times on this one machine's clock), not from how long it took.
    assert member.http.post(f"/v1/jobs/{long_job}/cancel").json()["state"] == "CANCELLING"
    member.wait(long_job, {"CANCELLED"}, timeout_s=60)
    long_history = _history(member, long_job)
    assert [(a, b) for a, b, _ in long_history[-2:]] == [("RUNNING", "CANCELLING"), ("CANCELLING", "CANCELLED")]
    cancelled_at = long_history[-1][2]
    [run] = _ray_submissions_of(ray_cluster, long_job)
    assert run.status.value == "STOPPED" and run.end_time is not None, run
    # CANCELLED only once Ray had stopped the run (Ray's end_time is in whole milliseconds).
    assert run.end_time / 1000 <= cancelled_at + 0.001, (run.end_time, long_history)

    finished = member.wait(queued_id, {"SUCCEEDED"}, timeout_s=240)
    assert finished["attempt"] == 1
    # It got the freed CPUs: admitted (STARTING) only after the cancelled job had ended.
    queued_history = _history(member, queued_id)
    assert [(a, b) for a, b, _ in queued_history[:2]] == [(None, "QUEUED"), ("QUEUED", "STARTING")], queued_history
    assert queued_history[1][2] > cancelled_at, (queued_history, long_history)
    assert len(_ray_submissions_of(ray_cluster, queued_id)) == 1  # the retry made no second run
    assert _ray_submissions_of(ray_cluster, never) == []
    assert member.job(never)["state"] == "CANCELLED"


def test_impossible_jobs_get_a_clear_reason_at_once(member, ray_cluster):
    too_many = member.submit(scaling={"num_workers": 3})
    assert too_many.status_code == 422
    assert "needs 3 CPU for 3 workers but the whole cluster has 2 CPU" in too_many.json()["detail"][0]["msg"]
    gpus = ray_cluster.num_gpus  # the machine's: 0 here, some on a GPU machine
    gpu = member.submit(scaling={"num_workers": 1, "use_gpu": True, "gpus_per_worker": gpus + 1})
    assert gpu.status_code == 422 and f"has {gpus} GPU" in gpu.json()["detail"][0]["msg"]
    assert member.http.get("/v1/jobs", params={"state": "QUEUED"}).json()["items"] == []


def test_a_second_start_adopts_the_running_local_cluster(ray_cluster):
    again = LocalRayCluster(
        ray_cluster.dir.parent,
        gcs_port=ray_cluster.gcs_port,
        dashboard_port=ray_cluster.dashboard_port,
        client_port=ray_cluster.client_port,
    )
    pid = ray_cluster.pid_path.read_text()
    again.start(timeout_s=10)
    assert again._process is None  # nothing new was started
    assert ray_cluster.pid_path.read_text() == pid


def test_with_ray_address_the_service_uses_that_cluster_and_starts_none(ray_cluster, tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_AUTH_TOKEN", ray_cluster.token())  # how a user hands over a remote token
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'o.db'}",
        var_dir=str(tmp_path / "var"),
        storage=str(tmp_path / "s"),
        ray_address=ray_cluster.dashboard_url,
        admin_token="x",
    )
    service = ControlPlane(settings, run_loops=False)
    service.start()
    try:
        assert service.local_cluster is None
        assert service.backend.capacity().total["CPU"] == 2
        assert not (tmp_path / "var" / "ray").exists()
    finally:
        service.stop()
