"""The REST API over a fake cluster, on SQLite and PostgreSQL: auth, validation, jobs, scheduling."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from api.app import create_app
from orchestrator.backend import RunStatus
from orchestrator.db.models import ApiKey, Job, JobState
from orchestrator.loops.log_archive import LogArchiver
from orchestrator.settings import Settings
from orchestrator.states.jobs import lock_job, set_job_state
from tests.fakes import FakeBackend
from tests.unit.api_helpers import (
    ADMIN,
    auth,
    count_jobs,
    driver_exits,
    make_project,
    reconcile,
    run_token,
    submit,
    tick,
)

# --- auth ---------------------------------------------------------------------------------------------


def test_health_needs_no_key_but_everything_else_does(client):
    assert client.get("/healthz").status_code == 200
    assert client.get("/readyz").json()["ray"].startswith("ok")
    for method, path in [
        ("get", "/v1/jobs"),
        ("post", "/v1/jobs"),
        ("get", "/v1/projects"),
        ("get", "/v1/jobs/x/logs"),
    ]:
        response = getattr(client, method)(path)
        assert response.status_code == 401, (path, response.text)
    assert client.get("/v1/jobs", headers=auth("ork_not-a-key")).status_code == 401


def test_keys_are_shown_once_and_stored_hashed(app, client):
    _, keys = make_project(client, "vision")
    with app.state.service.sessions() as session:
        stored = session.scalars(select(ApiKey.key_hash)).all()
    assert keys["member"] not in stored and len(stored) == 2
    assert all(len(h) == 64 for h in stored)
    assert client.get("/v1/jobs", headers=auth(keys["member"])).status_code == 200


def test_roles(client):
    project_id, keys = make_project(client, "vision")
    assert submit(client, keys["viewer"]).status_code == 403
    assert client.post("/v1/projects", json={"name": "x"}, headers=auth(keys["member"])).status_code == 403
    assert (
        client.post(f"/v1/projects/{project_id}/keys", json={"role": "admin"}, headers=auth(keys["member"])).status_code
        == 403
    )
    job = submit(client, keys["member"])
    assert job.status_code == 201
    assert client.get(f"/v1/jobs/{job.json()['id']}", headers=auth(keys["viewer"])).status_code == 200
    assert client.post(f"/v1/jobs/{job.json()['id']}/cancel", headers=auth(keys["viewer"])).status_code == 403


def test_other_projects_objects_answer_404(client):
    _, vision = make_project(client, "vision")
    _, speech = make_project(client, "speech")
    job_id = submit(client, vision["member"]).json()["id"]
    for path in ["", "/events", "/metrics", "/checkpoints", "/logs"]:
        assert client.get(f"/v1/jobs/{job_id}{path}", headers=auth(speech["member"])).status_code == 404, path
    assert client.post(f"/v1/jobs/{job_id}/cancel", headers=auth(speech["member"])).status_code == 404
    assert client.get("/v1/jobs", headers=auth(speech["viewer"])).json()["items"] == []
    # Admins see every project.
    assert [j["id"] for j in client.get("/v1/jobs", headers=auth(ADMIN)).json()["items"]] == [job_id]


def test_duplicate_project_is_a_conflict(client):
    make_project(client, "vision")
    assert client.post("/v1/projects", json={"name": "vision"}, headers=auth(ADMIN)).status_code == 409


# --- submitting ----------------------------------------------------------------------------------------


def test_submit_stores_the_full_spec_as_queued(client):
    _, keys = make_project(client, "vision")
    response = submit(client, keys["member"], name="first", epochs=3, labels={"team": "cv"}, scaling={"num_workers": 4})
    assert response.status_code == 201, response.text
    job = response.json()
    assert job["state"] == "QUEUED" and job["attempt"] == 0 and job["labels"] == {"team": "cv"}
    assert job["spec"]["epochs"] == 3 and job["spec"]["config"]["hidden"] == 128  # defaults filled
    assert job["spec"]["lr"] == {"base": 0.05, "base_batch": 64, "scaling": "linear", "warmup_steps": 0}
    # Recorded on the job: the strategy that runs, the global batch, and the LR scaled to it.
    assert job["plan"] == {"strategy": "ddp", "reason": "", "global_batch": 128, "lr": pytest.approx(0.1)}


@pytest.mark.parametrize(
    ("spec", "loc"),
    [
        ({"workload": "nope"}, ["body", "workload"]),
        ({"workload": "digits", "epochs": -2}, ["body", "epochs"]),
        ({"workload": "digits", "config": {"epochs": 2}}, ["body", "config", "epochs"]),
        ({"workload": "digits", "precision": "fp16"}, ["body"]),
        (
            {
                "workload": "tiny_gpt",
                "strategy": "auto",
                "config": {"text_path": "t", "width": 2048, "heads": 8},
                "scaling": {"num_workers": 2, "memory_per_worker_gb": 0.1},
            },
            ["body", "strategy"],
        ),
        ({"workload": "digits", "scaling": {"num_workers": 0}}, ["body", "scaling", "num_workers"]),
        ({"workload": "digits", "surprise": 1}, ["body", "surprise"]),
        ({"workload": "digits", "scaling": {"num_workers": 5}}, ["body", "scaling"]),  # 5 CPU > 4 in the cluster
        ({"workload": "digits", "scaling": {"num_workers": 1, "use_gpu": True}}, ["body", "scaling"]),
        ({"workload": "evil_pkg.mod:fn"}, ["body", "workload"]),
    ],
)
def test_invalid_specs_are_422_naming_the_field_and_store_nothing(app, client, spec, loc):
    response = client.post("/v1/jobs", json=spec, headers=auth(ADMIN))
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert any(d["loc"][: len(loc)] == loc for d in detail), detail
    assert all(d["msg"] for d in detail)
    assert count_jobs(app) == 0


def test_capacity_rejection_says_why(client):
    response = submit(client, ADMIN, scaling={"num_workers": 8})
    assert "needs 8 CPU for 8 workers but the whole cluster has 4 CPU" in response.json()["detail"][0]["msg"]


def test_a_rejection_looks_again_at_a_cluster_that_just_grew(client, backend):
    backend.cached_total = {"CPU": 1.0, "GPU": 0.0}  # looked at before two nodes joined
    assert submit(client, ADMIN, scaling={"num_workers": 4}).status_code == 201
    rejected = submit(client, ADMIN, scaling={"num_workers": 8})
    assert "needs 8 CPU for 8 workers but the whole cluster has 4 CPU" in rejected.json()["detail"][0]["msg"]


def test_allowed_custom_package_is_accepted(client):
    assert submit(client, ADMIN, workload="allowed_pkg.models:build", config={"x": 1}).status_code == 201


def test_malformed_json_is_422(client):
    response = client.post(
        "/v1/jobs", content=b"{not json", headers={**auth(ADMIN), "Content-Type": "application/json"}
    )
    assert response.status_code == 422


def test_idempotency_key_returns_the_same_job(app, client):
    headers = {**auth(ADMIN), "Idempotency-Key": "retry-1"}
    first = client.post("/v1/jobs", json={"workload": "digits"}, headers=headers)
    again = client.post("/v1/jobs", json={"workload": "digits"}, headers=headers)
    assert first.status_code == 201 and again.status_code == 200
    assert again.json()["id"] == first.json()["id"] and again.headers["Idempotent-Replayed"] == "true"
    other = client.post("/v1/jobs", json={"workload": "digits", "priority": 5}, headers=headers)
    assert other.status_code == 409 and "different spec" in other.json()["detail"]
    assert count_jobs(app) == 1


def test_a_job_stored_before_a_field_was_added_still_replays(app, client):
    """A spec stored by an older version lacks fields added since (e.g. ``code``): a retry with the same key
    and the same request is the same job, not a 409."""
    headers = {**auth(ADMIN), "Idempotency-Key": "before-upgrade"}
    first = client.post("/v1/jobs", json={"workload": "digits"}, headers=headers)
    with app.state.service.sessions() as session:
        job = session.get(Job, first.json()["id"])
        job.spec = {k: v for k, v in job.spec.items() if k != "code"}  # as an older version stored it
        session.commit()
    again = client.post("/v1/jobs", json={"workload": "digits"}, headers=headers)
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"], again.text
    other = client.post("/v1/jobs", json={"workload": "digits", "priority": 5}, headers=headers)
    assert other.status_code == 409


# --- listing ---------------------------------------------------------------------------------------------


def test_list_newest_first_with_cursor_pagination_and_filters(client):
    ids = [submit(client, ADMIN, labels={"n": str(i), "team": "a" if i % 2 else "b"}).json()["id"] for i in range(5)]
    seen, cursor = [], None
    while True:
        page = client.get(
            "/v1/jobs", params={"limit": 2, **({"cursor": cursor} if cursor else {})}, headers=auth(ADMIN)
        ).json()
        seen += [j["id"] for j in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == ids[::-1]
    team_a = client.get("/v1/jobs", params={"label": "team=a"}, headers=auth(ADMIN)).json()["items"]
    assert [j["id"] for j in team_a] == [ids[3], ids[1]]
    both = client.get("/v1/jobs", params={"label": ["team=a", "n=1"]}, headers=auth(ADMIN)).json()["items"]
    assert [j["id"] for j in both] == [ids[1]]
    assert client.get("/v1/jobs", params={"state": "RUNNING"}, headers=auth(ADMIN)).json()["items"] == []
    assert client.get("/v1/jobs", params={"state": "BOGUS"}, headers=auth(ADMIN)).status_code == 422
    assert client.get("/v1/jobs", params={"cursor": "garbage"}, headers=auth(ADMIN)).status_code == 422
    assert client.get("/v1/jobs", params={"label": "novalue"}, headers=auth(ADMIN)).status_code == 422


def test_unknown_job_is_404(client):
    for path in ["", "/events", "/metrics", "/checkpoints", "/logs"]:
        assert client.get(f"/v1/jobs/deadbeef{path}", headers=auth(ADMIN)).status_code == 404
    assert client.post("/v1/jobs/deadbeef/cancel", headers=auth(ADMIN)).status_code == 404


# --- scheduling, reconciling, cancelling -----------------------------------------------------------------


def test_scheduler_admits_by_priority_and_queues_the_rest_with_a_reason(app, client, backend):
    low = submit(client, ADMIN, priority=0).json()["id"]
    high = submit(client, ADMIN, priority=10).json()["id"]
    third = submit(client, ADMIN, priority=0).json()["id"]
    tick(app)  # 4 CPU: room for two 2-worker jobs
    states = {j: client.get(f"/v1/jobs/{j}", headers=auth(ADMIN)).json() for j in (low, high, third)}
    assert states[high]["state"] == "STARTING" and states[low]["state"] == "STARTING"
    assert states[third]["state"] == "QUEUED"
    assert states[third]["message"] == "waiting for resources: needs 2 CPU, 0 free"
    assert [s[0] for s in backend.submitted] == [f"{high}-1", f"{low}-1"]
    entrypoint, env = backend.submitted[0][1], backend.submitted[0][2]
    assert entrypoint == f"python -m workers.train.driver --job-id {high} --attempt 1"
    # The driver's one-use claim code, never a token (Ray lists a job's environment:
    # docs/security.md, "Run tokens are never in Ray's job table").
    assert env["ORCHESTRATOR_CLAIM_CODE"].startswith("jcl_") and env["OMP_NUM_THREADS"] == "1"
    assert "ORCHESTRATOR_JOB_TOKEN" not in env


@pytest.mark.parametrize(
    ("overrides", "watcher"),
    [
        ({}, "0"),
        ({"ray_address": "ray://head:10001"}, "1"),
        ({"train_preemption_watcher": True}, "1"),
        ({"ray_address": "ray://head:10001", "train_preemption_watcher": False}, "0"),
    ],
)
def test_ray_trains_preemption_watcher_is_on_only_where_nodes_can_be_drained(overrides, watcher):
    from orchestrator.services.launch import driver_env
    from orchestrator.settings import Settings

    env = driver_env("jtk_x", Settings(**overrides))
    assert env["RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"] == watcher


def test_each_local_cluster_gets_its_own_haproxy_files_and_ports(tmp_path, monkeypatch):
    from orchestrator.backend import local_cluster

    monkeypatch.setattr(local_cluster.tempfile, "gettempdir", lambda: str(tmp_path))
    first, second = local_cluster.serve_haproxy_env(6390), local_cluster.serve_haproxy_env(6391)
    assert first["RAY_SERVE_ENABLE_HA_PROXY"] == first["RAY_SERVE_THROUGHPUT_OPTIMIZED"] == "1"
    assert first["RAY_SERVE_HAPROXY_SOCKET_PATH"] == str(tmp_path / "haproxy-serve-6390" / "admin.sock")
    assert (tmp_path / "haproxy-serve-6390").is_dir() and len(first["RAY_SERVE_HAPROXY_SOCKET_PATH"]) < 108
    for key in ("RAY_SERVE_HAPROXY_CONFIG_FILE_LOC", "RAY_SERVE_HAPROXY_SOCKET_PATH", "RAY_SERVE_HAPROXY_STATS_PORT"):
        assert first[key] != second[key], key
    assert first["RAY_SERVE_HAPROXY_STATS_PORT"] != first["RAY_SERVE_HAPROXY_METRICS_PORT"]


def test_a_job_that_can_never_fit_fails_instead_of_waiting(app, client, backend):
    job = submit(client, ADMIN, scaling={"num_workers": 2}).json()["id"]
    backend.total = {"CPU": 1.0, "GPU": 0.0}  # the cluster shrank after submit
    tick(app)
    body = client.get(f"/v1/jobs/{job}", headers=auth(ADMIN)).json()
    assert body["state"] == "FAILED" and body["reason"] == "insufficient_resources"
    assert "whole cluster has 1 CPU" in body["message"]


def test_cluster_down_keeps_jobs_queued_with_a_reason(app, client, backend):
    backend.available = False
    job = submit(client, ADMIN).json()["id"]  # accepted: the scheduler re-checks capacity
    tick(app)
    body = client.get(f"/v1/jobs/{job}", headers=auth(ADMIN)).json()
    assert body["state"] == "QUEUED" and body["reason"] == "cluster_unavailable"
    backend.available = True
    tick(app)
    assert client.get(f"/v1/jobs/{job}", headers=auth(ADMIN)).json()["state"] == "STARTING"


def test_reconciler_follows_ray(app, client, backend):
    ok, bad, lost = (
        submit(client, ADMIN, scaling={"num_workers": 1}, retries={"max_attempts": 1}).json()["id"] for _ in range(3)
    )
    tick(app)
    backend.runs[f"{ok}-1"] = RunStatus.SUCCEEDED
    backend.runs[f"{bad}-1"] = RunStatus.FAILED
    del backend.runs[f"{lost}-1"]
    reconcile(app)
    assert client.get(f"/v1/jobs/{ok}", headers=auth(ADMIN)).json()["state"] == "SUCCEEDED"
    failed = client.get(f"/v1/jobs/{bad}", headers=auth(ADMIN)).json()
    assert failed["state"] == "FAILED" and failed["reason"] == "driver_failed" and "log of" in failed["message"]
    assert "attempt 1 of 1: none left" in failed["message"]
    # Just admitted: a missing submission is re-submitted (same id), not declared lost.
    assert client.get(f"/v1/jobs/{lost}", headers=auth(ADMIN)).json()["state"] == "STARTING"


def test_cancel_queued_job_never_starts(app, client, backend):
    job = submit(client, ADMIN).json()["id"]
    response = client.post(f"/v1/jobs/{job}/cancel", headers=auth(ADMIN))
    assert response.status_code == 200 and response.json()["state"] == "CANCELLED"
    tick(app)
    assert backend.submitted == []
    assert client.post(f"/v1/jobs/{job}/cancel", headers=auth(ADMIN)).status_code == 409


def test_cancel_started_job_stops_it_in_ray(app, client, backend):
    job = submit(client, ADMIN).json()["id"]
    tick(app)
    assert client.post(f"/v1/jobs/{job}/cancel", headers=auth(ADMIN)).json()["state"] == "CANCELLING"
    assert backend.stopped == [f"{job}-1"]
    reconcile(app)
    body = client.get(f"/v1/jobs/{job}", headers=auth(ADMIN)).json()
    assert body["state"] == "CANCELLED"
    history = [
        (e["from_state"], e["to_state"]) for e in client.get(f"/v1/jobs/{job}/events", headers=auth(ADMIN)).json()
    ]
    assert history == [
        (None, "QUEUED"),
        ("QUEUED", "STARTING"),
        ("STARTING", "CANCELLING"),
        ("CANCELLING", "CANCELLED"),
    ]


# --- the internal events endpoint ------------------------------------------------------------------------


def _started_job(app, client, backend) -> tuple[str, str]:
    job = submit(client, ADMIN).json()["id"]
    tick(app)
    return job, run_token(client, backend)


def test_events_need_the_jobs_own_token(app, client, backend):
    job, token = _started_job(app, client, backend)
    other, other_token = _started_job(app, client, backend)
    batch = {"attempt": 1, "events": [{"type": "state", "state": "running"}]}
    assert client.post(f"/internal/v1/jobs/{job}/events", json=batch).status_code == 401
    assert client.post(f"/internal/v1/jobs/{job}/events", json=batch, headers=auth(other_token)).status_code == 401
    assert client.post(f"/internal/v1/jobs/{job}/events", json=batch, headers=auth(ADMIN)).status_code == 401
    assert (
        client.post(f"/internal/v1/jobs/{job}/events", json={**batch, "attempt": 7}, headers=auth(token)).status_code
        == 409
    )
    assert client.post(f"/internal/v1/jobs/{job}/events", json=batch, headers=auth(token)).status_code == 200
    assert client.get(f"/v1/jobs/{job}", headers=auth(ADMIN)).json()["state"] == "RUNNING"
    assignment = client.get(f"/internal/v1/jobs/{job}/assignment", params={"attempt": 1}, headers=auth(token))
    assert assignment.status_code == 200 and assignment.json()["spec"]["workload"] == "digits"
    # A run's token is no API key: it reads no run, its own or another's, and lists nothing (docs/security.md,
    # "Threat model": user code on the cluster holds its job's token).
    for path in (f"/v1/jobs/{job}", f"/v1/jobs/{other}", "/v1/jobs", "/v1/sweeps", "/v1/code", "/v1/deployments"):
        assert client.get(path, headers=auth(token)).status_code == 401, path
    assert (
        client.get(f"/internal/v1/jobs/{other}/assignment", params={"attempt": 1}, headers=auth(token)).status_code
        == 401
    )


def test_events_record_metrics_checkpoints_and_result_idempotently(app, client, backend):
    job, token = _started_job(app, client, backend)
    ckpt_1 = f"{app.state.service.settings.storage_path}/{job}/checkpoint_1"  # a driver records its own run's only
    batch = {
        "attempt": 1,
        "events": [
            {"type": "state", "state": "running"},
            {"type": "metrics", "epoch": 1, "step": 23, "values": {"train_loss": 0.9, "val_accuracy": 0.8}},
            {
                "type": "checkpoint",
                "epoch": 1,
                "step": 23,
                "path": ckpt_1,
                "size_bytes": 100,
                "metrics": {"val_accuracy": 0.8},
            },
            {"type": "metrics", "epoch": 2, "step": 46, "values": {"train_loss": 0.5, "val_accuracy": 0.9}},
        ],
    }
    for _ in range(2):  # the reporter may deliver a batch twice
        assert client.post(f"/internal/v1/jobs/{job}/events", json=batch, headers=auth(token)).status_code == 200
    done = {
        "attempt": 1,
        "events": [{"type": "state", "state": "succeeded", "result": {"metrics": {"val_accuracy": 0.9}}}],
    }
    client.post(f"/internal/v1/jobs/{job}/events", json=done, headers=auth(token))
    driver_exits(app, backend)  # its end is applied once Ray says the job ended
    body = client.get(f"/v1/jobs/{job}", headers=auth(ADMIN)).json()
    assert body["state"] == "SUCCEEDED" and body["result"] == {"metrics": {"val_accuracy": 0.9}}
    assert body["latest_metrics"]["val_accuracy"] == 0.9 and body["latest_metrics"]["epoch"] == 2
    metrics = client.get(f"/v1/jobs/{job}/metrics", headers=auth(ADMIN)).json()
    assert [(m["epoch"], m["step"], m["attempt"]) for m in metrics] == [(1, 23, 1), (2, 46, 1)]
    checkpoints = client.get(f"/v1/jobs/{job}/checkpoints", headers=auth(ADMIN)).json()
    assert [(c["path"], c["size_bytes"], c["epoch"]) for c in checkpoints] == [(ckpt_1, 100, 1)]


def test_a_failure_reported_while_cancelling_ends_cancelled(app, client, backend):
    job, token = _started_job(app, client, backend)
    client.post(f"/v1/jobs/{job}/cancel", headers=auth(ADMIN))
    failed = {"attempt": 1, "events": [{"type": "state", "state": "failed", "message": "SIGTERM"}]}
    assert client.post(f"/internal/v1/jobs/{job}/events", json=failed, headers=auth(token)).json()["applied"] == 0
    reconcile(app)
    assert client.get(f"/v1/jobs/{job}", headers=auth(ADMIN)).json()["state"] == "CANCELLED"


def test_logs_of_a_started_job(app, client, backend):
    job, _ = _started_job(app, client, backend)
    assert client.get(f"/v1/jobs/{job}/logs", headers=auth(ADMIN)).text == f"log of {job}-1\n"


def test_following_an_ended_job_waits_for_its_driver_to_exit(app, client, backend, monkeypatch):
    import asyncio

    from orchestrator.services import logs as logs_service

    job, token = _started_job(app, client, backend)
    printed = [f"log of {job}-1\n"]
    monkeypatch.setattr(backend, "logs", lambda submission_id: "".join(printed))
    done = {"attempt": 1, "events": [{"type": "state", "state": "running"}, {"type": "state", "state": "succeeded"}]}
    client.post(f"/internal/v1/jobs/{job}/events", json=done, headers=auth(token))
    service = app.state.service
    # Ended as the reconciler ends it once Ray says so, while the fake says the driver still runs: Ray's word
    # that the job ended can come before the driver's last lines reach its log.
    with service.sessions.begin() as session:
        set_job_state(session, lock_job(session, job), JobState.SUCCEEDED, "completed")
    assert client.get(f"/v1/jobs/{job}", headers=auth(ADMIN)).json()["state"] == "SUCCEEDED"

    follows = logs_service.LogFollows(service.sessions, backend, service.log_archive, max_per_key=2, poll_s=0)

    async def scenario() -> None:
        stream = follows.start(job, "k")
        assert await anext(stream) == printed[0]
        printed.append("driver shutting down\n")  # the job has ended; its driver still runs and prints
        assert await anext(stream) == "driver shutting down\n"
        printed.append("[repeated 3x across cluster]\n")
        backend.runs[f"{job}-1"] = RunStatus.SUCCEEDED  # the driver exited
        assert [chunk async for chunk in stream] == ["[repeated 3x across cluster]\n"]  # its last words, then the end

        # A driver that never exits holds a follow no longer than the grace after the job ended.
        backend.runs[f"{job}-1"] = RunStatus.RUNNING
        monkeypatch.setattr(logs_service, "DRIVER_EXIT_GRACE_S", 0)
        assert "".join([chunk async for chunk in follows.start(job, "k")]) == "".join(printed)
        assert follows.active("k") == 0  # every ended follow gave its slot back

    asyncio.run(scenario())


def archive_logs(app):
    service = app.state.service
    LogArchiver(service.sessions, service.backend, service.log_archive).tick()


def test_logs_are_copied_to_storage_as_they_run_and_served_after_ray_lost_them(app, client, backend, tmp_path):
    job, token = _started_job(app, client, backend)
    client.post(
        f"/internal/v1/jobs/{job}/events",
        json={"attempt": 1, "events": [{"type": "state", "state": "running"}]},
        headers=auth(token),
    )
    archive_logs(app)
    copy = tmp_path / "storage" / job / "logs" / "attempt-0001.log"
    assert copy.read_text() == f"log of {job}-1\n"
    del backend.runs[f"{job}-1"]  # the head died: Ray's job store is gone with it
    reconcile(app)  # attempt 2
    archive_logs(app)
    assert (tmp_path / "storage" / job / "logs" / "attempt-0002.log").read_text() == f"log of {job}-2\n"
    get = lambda **params: client.get(f"/v1/jobs/{job}/logs", params=params, headers=auth(ADMIN))  # noqa: E731
    assert get().text == f"log of {job}-2\n"
    assert get(attempt=1).text == f"log of {job}-1\n"  # from storage: Ray has no record of it any more
    backend.available = False  # the whole cluster is gone
    assert get().text == f"log of {job}-2\n"
    assert get(attempt=3).status_code == 404 and "2 attempt(s)" in get(attempt=3).text
    assert get(attempt=0).status_code == 422


def test_a_dead_local_ray_head_is_started_again_and_its_drivers_silenced(app, client, backend, tmp_path, monkeypatch):
    import subprocess

    from orchestrator.backend.local_cluster import LocalRayCluster

    job, token = _started_job(app, client, backend)
    service = app.state.service
    cluster = service.local_cluster = LocalRayCluster(tmp_path, gcs_port=1, dashboard_port=2, client_port=3)
    started = []
    monkeypatch.setattr(cluster, "start", lambda: started.append(True))
    monkeypatch.setattr(cluster, "_answers", lambda: False)
    cluster._process = subprocess.Popen(["sleep", "30"])
    service._keep_local_head()
    assert not started  # alive: nothing to do
    cluster._process.kill()
    cluster._process.wait()
    service._keep_local_head()
    assert started == [True]
    # The lost head's driver can no longer end the job; the reconciler moves it to a new attempt.
    failed = {"attempt": 1, "events": [{"type": "state", "state": "failed", "reason": "worker_died"}]}
    assert client.post(f"/internal/v1/jobs/{job}/events", json=failed, headers=auth(token)).status_code == 401


def test_only_the_newest_checkpoints_are_kept_like_ray_does(app, client, backend):
    job = submit(client, ADMIN, checkpoint={"keep": 2}).json()["id"]
    tick(app)
    token = run_token(client, backend)
    run = f"{app.state.service.settings.storage_path}/{job}"
    events = [
        {"type": "checkpoint", "epoch": e, "step": 10 * e, "path": f"{run}/checkpoint_{e}", "size_bytes": 1}
        for e in (1, 2, 3)
    ]
    client.post(f"/internal/v1/jobs/{job}/events", json={"attempt": 1, "events": events}, headers=auth(token))
    paths = [c["path"] for c in client.get(f"/v1/jobs/{job}/checkpoints", headers=auth(ADMIN)).json()]
    assert paths == [f"{run}/checkpoint_2", f"{run}/checkpoint_3"]


def test_without_an_admin_token_the_first_start_prints_an_admin_key_once(database_url, tmp_path, capsys):
    settings = Settings(database_url=database_url, storage=str(tmp_path / "s"), var_dir=str(tmp_path / "v"))
    with TestClient(create_app(settings, backend=FakeBackend(), run_loops=False)) as first:
        printed = capsys.readouterr().out
        key = next(line.strip() for line in printed.splitlines() if line.strip().startswith("ork_"))
        assert first.post("/v1/projects", json={"name": "p"}, headers=auth(key)).status_code == 201
        assert first.get("/v1/jobs", headers=auth(ADMIN)).status_code == 401  # no token configured
    with TestClient(create_app(settings, backend=FakeBackend(), run_loops=False)) as second:
        assert "ork_" not in capsys.readouterr().out  # shown only once
        assert second.get("/v1/projects", headers=auth(key)).status_code == 200


def test_a_lost_submit_is_made_again_with_the_same_submission_id(app, client, backend, monkeypatch):
    job, first_token = _started_job(app, client, backend)
    del backend.runs[f"{job}-1"]  # as if the control plane died between commit and submit
    monkeypatch.setattr("orchestrator.loops.reconciler.RESUBMIT_GRACE", timedelta(0))
    reconcile(app)
    assert [s[0] for s in backend.submitted] == [f"{job}-1", f"{job}-1"]
    new_token = run_token(client, backend)
    running = {"attempt": 1, "events": [{"type": "state", "state": "running"}]}
    assert client.post(f"/internal/v1/jobs/{job}/events", json=running, headers=auth(first_token)).status_code == 401
    assert client.post(f"/internal/v1/jobs/{job}/events", json=running, headers=auth(new_token)).status_code == 200
    assert client.get(f"/v1/jobs/{job}", headers=auth(ADMIN)).json()["attempt"] == 1


def test_a_driver_ray_could_not_place_is_submitted_again_as_the_same_attempt(app, client, backend, monkeypatch):
    """Ray failed the submission before its driver ran (the supervisor could not be placed: a head restarting or
    draining): no attempt of the run's is spent. Ray's record is deleted, and after the grace the same submission
    id goes again; a driver that ran and failed still costs an attempt."""
    job, _ = _started_job(app, client, backend)
    backend.runs[f"{job}-1"] = RunStatus.FAILED
    backend.unschedulable.add(f"{job}-1")
    reconcile(app)
    assert backend.forgotten == [f"{job}-1"] and f"{job}-1" not in backend.runs
    waiting = client.get(f"/v1/jobs/{job}", headers=auth(ADMIN)).json()
    assert (waiting["state"], waiting["attempt"]) == ("STARTING", 1), waiting
    reconcile(app)  # within the grace: nothing yet
    assert [s[0] for s in backend.submitted] == [f"{job}-1"]
    monkeypatch.setattr("orchestrator.loops.reconciler.RESUBMIT_GRACE", timedelta(0))
    reconcile(app)
    assert [s[0] for s in backend.submitted] == [f"{job}-1", f"{job}-1"]
    backend.runs[f"{job}-1"] = RunStatus.FAILED  # now its driver ran and failed
    reconcile(app)
    restarted = client.get(f"/v1/jobs/{job}", headers=auth(ADMIN)).json()
    assert (restarted["state"], restarted["reason"], restarted["attempt"]) == ("RESTARTING", "driver_failed", 2)
    assert backend.forgotten == [f"{job}-1"]


def test_a_submission_id_someone_else_took_first_fails_the_run_and_is_never_followed(app, client, backend):
    """Someone with the cluster's Ray token submits a job under a run's next submission id before the control plane
    does: Ray refuses ours as a duplicate, and that job (other environment variables, no claim code of ours) is not
    taken for the run's attempt: the run fails, saying so."""
    job = submit(client, ADMIN).json()["id"]
    backend.squat(f"{job}-1")
    tick(app)
    failed = client.get(f"/v1/jobs/{job}", headers=auth(ADMIN)).json()
    assert (failed["state"], failed["reason"]) == ("FAILED", "submission_taken"), failed
    assert f"{job}-1" in failed["message"] and "did not submit" in failed["message"]
    reconcile(app)  # Ray's job under the id is RUNNING: nothing follows it
    assert client.get(f"/v1/jobs/{job}", headers=auth(ADMIN)).json()["state"] == "FAILED"


def test_gpu_jobs_queue_for_gpus(app, client, backend):
    backend.total = {"CPU": 8.0, "GPU": 1.0}
    too_big = submit(client, ADMIN, scaling={"num_workers": 2, "use_gpu": True})
    assert too_big.status_code == 422 and "whole cluster has 1 GPU" in too_big.json()["detail"][0]["msg"]
    first = submit(client, ADMIN, scaling={"num_workers": 1, "use_gpu": True}).json()["id"]
    second = submit(client, ADMIN, scaling={"num_workers": 1, "use_gpu": True}).json()["id"]
    cpu_only = submit(client, ADMIN, scaling={"num_workers": 2}).json()["id"]
    tick(app)
    assert client.get(f"/v1/jobs/{first}", headers=auth(ADMIN)).json()["state"] == "STARTING"
    waiting = client.get(f"/v1/jobs/{second}", headers=auth(ADMIN)).json()
    assert waiting["state"] == "QUEUED" and waiting["message"] == "waiting for resources: needs 1 GPU, 0 free"
    assert client.get(f"/v1/jobs/{cpu_only}", headers=auth(ADMIN)).json()["state"] == "STARTING"  # CPUs were free


def test_plan_endpoint(client):
    body = {"params": 2e9, "precision": "bf16", "optimizer": "adam", "gpus": 8, "gpu_memory_gb": 16, "activation_gb": 3}
    assert client.post("/v1/plan", json=body).status_code == 401
    answer = client.post("/v1/plan", json=body, headers=auth(ADMIN)).json()
    assert answer["recommended"] == "fsdp" and answer["strategies"]["ddp"]["fits"] is False
    bad = client.post("/v1/plan", json={"gpu_memory_gb": 16}, headers=auth(ADMIN))
    assert bad.status_code == 422 and "either params or workload" in bad.text


def test_auto_strategy_is_resolved_and_explained_on_the_job(app, client, backend):
    job = submit(client, ADMIN, strategy="auto").json()
    assert job["plan"]["strategy"] == "ddp" and job["plan"]["reason"].startswith("planner: ddp fits")
    tick(app)
    token = run_token(client, backend)
    assignment = client.get(
        f"/internal/v1/jobs/{job['id']}/assignment", params={"attempt": 1}, headers=auth(token)
    ).json()
    assert assignment["plan"]["strategy"] == "ddp" and assignment["spec"]["strategy"] == "auto"


def test_a_lost_driver_gets_a_new_attempt_until_attempts_run_out(app, client, backend):
    job, token = _started_job(app, client, backend)  # max_attempts defaults to 3
    first_token = token
    for attempt in (1, 2):
        running = {"attempt": attempt, "events": [{"type": "state", "state": "running"}]}
        assert client.post(f"/internal/v1/jobs/{job}/events", json=running, headers=auth(token)).status_code == 200
        del backend.runs[f"{job}-{attempt}"]  # the driver (or the whole head) went away
        reconcile(app)
        body = client.get(f"/v1/jobs/{job}", headers=auth(ADMIN)).json()
        assert body["state"] == "RESTARTING" and body["reason"] == "driver_lost" and body["attempt"] == attempt + 1
        assert f"starting attempt {attempt + 1} of 3" in body["message"]
        token = run_token(client, backend)
    assert [s[0] for s in backend.submitted] == [f"{job}-1", f"{job}-2", f"{job}-3"]
    # The old driver's token no longer writes; the new one does, and its first event resumes RUNNING.
    stale = {"attempt": 3, "events": [{"type": "state", "state": "running"}]}
    assert client.post(f"/internal/v1/jobs/{job}/events", json=stale, headers=auth(first_token)).status_code == 401
    resumed = {"attempt": 3, "events": [{"type": "state", "state": "running"}]}
    assert client.post(f"/internal/v1/jobs/{job}/events", json=resumed, headers=auth(token)).status_code == 200
    backend.runs[f"{job}-3"] = RunStatus.FAILED
    reconcile(app)
    body = client.get(f"/v1/jobs/{job}", headers=auth(ADMIN)).json()
    assert body["state"] == "FAILED" and "attempt 3 of 3: none left" in body["message"]
    history = [
        (e["to_state"], e["reason"], e["attempt"])
        for e in client.get(f"/v1/jobs/{job}/events", headers=auth(ADMIN)).json()
    ]
    assert history[2:] == [
        ("RUNNING", "training_started", 1),
        ("RESTARTING", "driver_lost", 1),
        ("RUNNING", "training_started", 2),
        ("RESTARTING", "driver_lost", 2),
        ("RUNNING", "training_started", 3),
        ("FAILED", "driver_failed", 3),
    ]


def test_a_new_attempt_that_ray_lost_before_it_ran_is_resubmitted_not_counted(app, client, backend, monkeypatch):
    job, token = _started_job(app, client, backend)
    client.post(
        f"/internal/v1/jobs/{job}/events",
        json={"attempt": 1, "events": [{"type": "state", "state": "running"}]},
        headers=auth(token),
    )
    del backend.runs[f"{job}-1"]
    reconcile(app)  # attempt 2 submitted
    del backend.runs[f"{job}-2"]  # and lost with the head before its driver said anything
    monkeypatch.setattr("orchestrator.loops.reconciler.RESUBMIT_GRACE", timedelta(0))
    reconcile(app)
    assert [s[0] for s in backend.submitted] == [f"{job}-1", f"{job}-2", f"{job}-2"]
    assert client.get(f"/v1/jobs/{job}", headers=auth(ADMIN)).json()["attempt"] == 2


def test_a_driver_that_failed_for_good_is_not_retried_even_if_its_report_was_lost(app, client, backend):
    job, _ = _started_job(app, client, backend)
    backend.runs[f"{job}-1"] = RunStatus.FAILED
    backend.exit_codes[f"{job}-1"] = 3  # DriverExit.TRAINING_FAILED: an app error, OOM or restarts spent
    reconcile(app)
    body = client.get(f"/v1/jobs/{job}", headers=auth(ADMIN)).json()
    assert (body["state"], body["reason"], body["attempt"]) == ("FAILED", "training_failed", 1)
    assert [s[0] for s in backend.submitted] == [f"{job}-1"]


def test_a_failure_reported_with_its_cause_ends_the_job_with_that_reason(app, client, backend):
    job, token = _started_job(app, client, backend)
    failed = {"type": "state", "state": "failed", "reason": "oom", "message": "out of memory (never retried)"}
    client.post(f"/internal/v1/jobs/{job}/events", json={"attempt": 1, "events": [failed]}, headers=auth(token))
    backend.runs[f"{job}-1"] = RunStatus.FAILED
    backend.exit_codes[f"{job}-1"] = 3
    reconcile(app)
    body = client.get(f"/v1/jobs/{job}", headers=auth(ADMIN)).json()
    assert (body["state"], body["reason"]) == ("FAILED", "oom") and "never retried" in body["message"]
    assert len(backend.submitted) == 1


@pytest.mark.parametrize("ray_status", [RunStatus.PENDING, RunStatus.RUNNING])
def test_a_job_stuck_starting_is_stopped_and_retried_then_fails_with_start_timeout(app, client, backend, ray_status):
    app.state.service.settings.start_timeout_s = 0.01
    job = submit(client, ADMIN, retries={"max_attempts": 2}).json()["id"]
    tick(app)
    backend.runs[f"{job}-1"] = ray_status  # pending in Ray, or running but never training
    time.sleep(0.05)
    reconcile(app)
    body = client.get(f"/v1/jobs/{job}", headers=auth(ADMIN)).json()
    assert (body["state"], body["reason"], body["attempt"]) == ("RESTARTING", "start_timeout", 2)
    assert "ORCHESTRATOR_START_TIMEOUT_S" in body["message"] and str(ray_status) in body["message"]
    assert backend.stopped == [f"{job}-1"] and backend.submitted[-1][0] == f"{job}-2"
    time.sleep(0.05)
    reconcile(app)
    body = client.get(f"/v1/jobs/{job}", headers=auth(ADMIN)).json()
    assert (body["state"], body["reason"]) == ("FAILED", "start_timeout") and "attempt 2 of 2: none left" in body[
        "message"
    ]
    assert backend.stopped == [f"{job}-1", f"{job}-2"] and len(backend.submitted) == 2


def test_a_worker_restart_is_reported_as_restarting(app, client, backend):
    job, token = _started_job(app, client, backend)
    for state in ("running", "restarting", "running"):
        event = {"type": "state", "state": state}
        client.post(f"/internal/v1/jobs/{job}/events", json={"attempt": 1, "events": [event]}, headers=auth(token))
    history = [(e["to_state"], e["reason"]) for e in client.get(f"/v1/jobs/{job}/events", headers=auth(ADMIN)).json()]
    assert history[2:] == [
        ("RUNNING", "training_started"),
        ("RESTARTING", "worker_died"),
        ("RUNNING", "training_started"),
    ]
