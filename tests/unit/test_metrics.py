"""GET /metrics: a job run through the unit-test app over its fake cluster moves each metric by exactly what
happened; the jobs-by-state gauge is the database's; labels stay bounded; who may scrape (ORCHESTRATOR_METRICS)."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import func, select

from api.app import create_app
from orchestrator.db.models import Job, JobState
from orchestrator.loops.runner import Loop
from orchestrator.metrics import Metrics
from orchestrator.settings import Settings
from orchestrator.states.jobs import lock_job, set_job_state
from tests.unit.api_helpers import ADMIN, auth, driver_exits, make_project, reconcile, run_token, submit, tick

Samples = dict[tuple[str, frozenset], float]


def scrape(client, key: str = ADMIN) -> tuple[Samples, str]:
    response = client.get("/metrics", headers=auth(key))
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    samples = {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }
    return samples, response.text


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def moved(before: Samples, after: Samples, name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


def post_events(client, job: str, token: str, attempt: int, *events: dict) -> None:
    response = client.post(
        f"/internal/v1/jobs/{job}/events", json={"attempt": attempt, "events": list(events)}, headers=auth(token)
    )
    assert response.status_code == 200, response.text


def test_a_job_run_moves_every_counter_by_what_happened(app, client, backend):
    before, _ = scrape(client)
    job = submit(client, ADMIN, retries={"max_attempts": 2}).json()["id"]
    tick(app)  # admitted: QUEUED -> STARTING, submit #1
    post_events(client, job, run_token(client, backend), 1, {"type": "state", "state": "running"})
    backend.available = False  # Ray away for one reconcile: a failed call, counted as such
    reconcile(app)
    backend.available = True
    del backend.runs[f"{job}-1"]  # the driver vanished: a restart, submit #2
    reconcile(app)
    token = run_token(client, backend)
    post_events(client, job, token, 2, {"type": "state", "state": "running"})
    post_events(client, job, token, 2, {"type": "state", "state": "succeeded"})  # Ray asked once: still running
    driver_exits(app, backend)  # the reconciler sees the Ray job end and applies the reported success
    assert client.get(f"/v1/jobs/{job}", headers=auth(ADMIN)).json()["state"] == "SUCCEEDED"
    after, text = scrape(client)

    assert moved(before, after, "orchestrator_jobs_submitted_total") == 1
    assert moved(before, after, "orchestrator_jobs_finished_total", state="SUCCEEDED") == 1
    assert moved(before, after, "orchestrator_jobs_finished_total", state="FAILED") == 0
    assert moved(before, after, "orchestrator_job_restarts_total", reason="driver_lost") == 1
    assert sum(v for (name, _), v in after.items() if name == "orchestrator_job_restarts_total") == 1
    assert moved(before, after, "orchestrator_job_queue_wait_seconds_count") == 1
    assert moved(before, after, "orchestrator_job_run_duration_seconds_count", state="SUCCEEDED") == 1
    assert moved(before, after, "orchestrator_job_run_duration_seconds_count", state="FAILED") == 0
    # Ray: two submits, the reconciles' status reads (one of them while Ray was away) and the events route's
    # look at the Ray job when the run reported its end.
    assert moved(before, after, "orchestrator_ray_api_calls_total", method="submit", outcome="ok") == 2
    assert moved(before, after, "orchestrator_ray_api_calls_total", method="info", outcome="unavailable") == 1
    assert moved(before, after, "orchestrator_ray_api_calls_total", method="info", outcome="ok") == 3
    assert backend.asked.count("info") == 4  # the metric counted every call the fake saw
    # HTTP by route template: the job's own GET and the driver's four event batches, never the job's id.
    assert value(after, "orchestrator_http_requests_total", method="GET", route="/v1/jobs/{job_id}", status="2xx") == 1
    assert (
        value(
            after,
            "orchestrator_http_requests_total",
            method="POST",
            route="/internal/v1/jobs/{job_id}/events",
            status="2xx",
        )
        == 3
    )
    assert value(after, "orchestrator_http_request_duration_seconds_count", method="POST", route="/v1/jobs") == 1
    assert job not in text


def test_the_jobs_by_state_gauge_is_the_databases_group_by(app, client, backend):
    queued, started, cancelled = (submit(client, ADMIN).json()["id"] for _ in range(3))
    with app.state.service.sessions.begin() as session:  # only `started` gets admitted
        for job_id in (queued, cancelled):
            set_job_state(session, lock_job(session, job_id), JobState.FAILED, "test")
    tick(app)
    client.post(f"/v1/jobs/{started}/cancel", headers=auth(ADMIN))
    samples, _ = scrape(client)
    with app.state.service.sessions() as session:
        counts = dict(session.execute(select(Job.state, func.count()).group_by(Job.state)).all())
    assert counts == {JobState.FAILED: 2, JobState.CANCELLING: 1}
    for state in JobState:
        assert value(samples, "orchestrator_jobs", state=state.value) == counts.get(state, 0), state


def test_a_change_rolled_back_counts_nothing(app, client):
    job = submit(client, ADMIN).json()["id"]
    before, _ = scrape(client)
    with pytest.raises(RuntimeError), app.state.service.sessions.begin() as session:
        set_job_state(session, lock_job(session, job), JobState.FAILED, "test")
        raise RuntimeError("the caller's transaction fails after the transition")
    after, _ = scrape(client)
    assert moved(before, after, "orchestrator_jobs_finished_total", state="FAILED") == 0
    assert client.get(f"/v1/jobs/{job}", headers=auth(ADMIN)).json()["state"] == "QUEUED"


def test_an_unknown_path_is_one_unmatched_series(client):
    for path in ("/nope/1", "/nope/2", "/v1/jobs/x/y/z"):
        assert client.get(path).status_code == 404
    samples, text = scrape(client)
    assert value(samples, "orchestrator_http_requests_total", method="GET", route="unmatched", status="4xx") == 3
    assert "/nope" not in text


def test_a_restart_reason_a_driver_makes_up_is_bounded():
    metrics = Metrics()
    assert metrics.restart_reason("worker_died") == "worker_died"
    assert metrics.restart_reason("Not A Code!") == "other"
    for i in range(100):
        metrics.restart_reason(f"code_{i}")
    assert len(metrics._restart_reasons) <= 32 and metrics.restart_reason("code_99") == "other"


def test_a_loops_last_success_moves_only_on_a_good_tick():
    metrics = Metrics()
    gauge = metrics.loop_last_success

    def fails() -> None:
        raise RuntimeError("boom")

    assert Loop("scheduler", lambda: None, 1, gauge).run_once()
    good = gauge.labels("scheduler")._value.get()
    assert good > 0
    assert not Loop("scheduler", fails, 1, gauge).run_once()
    assert gauge.labels("scheduler")._value.get() == good


def test_two_apps_in_one_process_count_apart(tmp_path, backend):
    def app(name: str):
        settings = Settings(
            database_url=f"sqlite:///{tmp_path}/{name}.db",
            storage=str(tmp_path / name / "storage"),
            var_dir=str(tmp_path / name / "var"),
            admin_token=ADMIN,
        )
        return create_app(settings, backend=backend, run_loops=False)

    one, two = app("one"), app("two")
    one.state.service.metrics.jobs_submitted.inc()
    assert one.state.service.metrics.registry is not two.state.service.metrics.registry
    assert one.state.service.metrics.jobs_submitted._value.get() == 1
    assert two.state.service.metrics.jobs_submitted._value.get() == 0


# --- who may scrape ------------------------------------------------------------------------------------


@pytest.mark.parametrize("settings_overrides", [{"metrics": "off"}])
def test_off_is_404_even_for_an_admin(client):
    assert client.get("/metrics", headers=auth(ADMIN)).status_code == 404


@pytest.mark.parametrize("settings_overrides", [{"metrics": "open"}])
def test_open_needs_no_key(client):
    response = client.get("/metrics")
    assert response.status_code == 200 and "orchestrator_jobs_submitted_total" in response.text


def test_admin_by_default_needs_a_cluster_wide_admin_key(client):
    project, keys = make_project(client, "scrapers")
    project_admin = client.post(f"/v1/projects/{project}/keys", json={"role": "admin"}, headers=auth(ADMIN))
    assert project_admin.status_code == 201, project_admin.text
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers=auth("not-a-key")).status_code == 401
    assert client.get("/metrics", headers=auth(keys["member"])).status_code == 403
    assert client.get("/metrics", headers=auth(project_admin.json()["key"])).status_code == 403
    assert client.get("/metrics", headers=auth(ADMIN)).status_code == 200


def test_the_setting_refuses_a_mode_it_does_not_know():
    with pytest.raises(ValueError, match="metrics"):
        Settings(metrics="public")


# --- sweeps and deployments ----------------------------------------------------------------------------


def test_sweeps_submitted_and_finished_by_state_and_the_sweeps_gauge(app, client, backend):
    from tests.unit.test_sweeps import driver_token, post_sweep

    before, _ = scrape(client)
    done = post_sweep(client, max_concurrent_trials=1).json()["id"]
    tick(app)  # admitted: QUEUED -> STARTING
    events = [{"type": "state", "state": "running"}, {"type": "state", "state": "succeeded"}]
    posted = client.post(
        f"/internal/v1/sweeps/{done}/events",
        json={"attempt": 1, "events": events},
        headers=driver_token(client, backend, f"{done}-1"),
    )
    assert posted.status_code == 200, posted.text
    # The same batch again (a driver's retry) is no news: it must not count a second time.
    client.post(
        f"/internal/v1/sweeps/{done}/events",
        json={"attempt": 1, "events": events},
        headers=driver_token(client, backend, f"{done}-1"),
    )
    driver_exits(app, backend, f"{done}-1")  # Ray confirms the reported end
    never = post_sweep(client, max_concurrent_trials=1).json()["id"]
    assert client.post(f"/v1/sweeps/{never}/cancel", headers=auth(ADMIN)).json()["state"] == "CANCELLED"
    waiting = post_sweep(client, max_concurrent_trials=1).json()["id"]
    after, text = scrape(client)

    assert moved(before, after, "orchestrator_sweeps_submitted_total") == 3
    assert moved(before, after, "orchestrator_sweeps_finished_total", state="SUCCEEDED") == 1
    assert moved(before, after, "orchestrator_sweeps_finished_total", state="CANCELLED") == 1
    assert moved(before, after, "orchestrator_sweeps_finished_total", state="FAILED") == 0
    # Jobs are not sweeps: a sweep moves no job counter.
    assert moved(before, after, "orchestrator_jobs_submitted_total") == 0
    assert value(after, "orchestrator_sweeps", state="SUCCEEDED") == 1
    assert value(after, "orchestrator_sweeps", state="CANCELLED") == 1
    assert value(after, "orchestrator_sweeps", state="QUEUED") == 1
    assert sum(v for (name, _), v in after.items() if name == "orchestrator_sweeps") == 3
    assert not any(sweep_id in text for sweep_id in (done, never, waiting))


@pytest.mark.parametrize("settings_overrides", [{"serve_port": 8123, "workload_packages": ""}])
def test_deployment_rollouts_by_outcome_and_the_deployments_gauge(app, client, backend, tmp_path):
    from tests.unit.test_deployments import finished_job, get, healthy
    from tests.unit.test_deployments import reconcile as serve_reconcile

    before, _ = scrape(client)
    job_id, checkpoints = finished_job(app, tmp_path)
    healthy(app, client, backend, "digits", source={"job_id": job_id})  # DEPLOYING -> HEALTHY: promoted
    # An update that fails: UPDATING -> UNHEALTHY, the old version keeps serving.
    client.patch("/v1/deployments/digits", json={"source": {"checkpoint_id": checkpoints[0]}}, headers=auth(ADMIN))
    serve_reconcile(app)
    backend.serve_settle("digits", "DEPLOY_FAILED", message="constructor raised")
    serve_reconcile(app)
    assert get(client, "digits")["state"] == "UNHEALTHY"
    mid, _ = scrape(client)
    assert moved(before, mid, "orchestrator_deployment_rollouts_total", outcome="promoted") == 1
    assert moved(before, mid, "orchestrator_deployment_rollouts_total", outcome="failed") == 1
    assert value(mid, "orchestrator_deployments", state="UNHEALTHY") == 1

    # A rollback that comes up (promoted), a second deployment still rolling out, then a delete.
    assert client.post("/v1/deployments/digits/rollback", headers=auth(ADMIN)).status_code == 200
    serve_reconcile(app)
    backend.serve_settle("digits", "RUNNING")
    serve_reconcile(app)
    assert get(client, "digits")["state"] == "HEALTHY"
    assert (
        client.post(
            "/v1/deployments", json={"name": "other", "source": {"job_id": job_id}}, headers=auth(ADMIN)
        ).status_code
        == 201
    )
    after, _ = scrape(client)
    assert moved(before, after, "orchestrator_deployment_rollouts_total", outcome="promoted") == 2
    assert moved(before, after, "orchestrator_deployment_rollouts_total", outcome="failed") == 1
    assert value(after, "orchestrator_deployments", state="HEALTHY") == 1
    assert value(after, "orchestrator_deployments", state="DEPLOYING") == 1
    assert value(after, "orchestrator_deployments", state="UNHEALTHY") == 0
    assert client.delete("/v1/deployments/other", headers=auth(ADMIN)).status_code == 200
    deleted, _ = scrape(client)
    assert value(deleted, "orchestrator_deployments", state="DEPLOYING") == 0
    assert value(deleted, "orchestrator_deployments", state="DELETED") == 1
    # A delete mid-rollout is no rollout outcome.
    assert moved(after, deleted, "orchestrator_deployment_rollouts_total", outcome="failed") == 0


def test_a_request_is_counted_before_its_client_can_read_the_answer():
    """A client that has its answer and then scrapes /metrics sees that request counted: counted only after
    the last byte was sent, a CI run (on 917ad48) saw one poll of GET /v1/jobs/{job_id} missing."""
    import asyncio

    from api.http_metrics import HttpMetrics

    metrics = Metrics()
    counted_when_the_client_had_the_start: list[float] = []

    def requests_counted() -> float:
        return metrics.http_requests.labels("GET", "unmatched", "2xx")._value.get()

    async def endpoint(scope, receive, send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async def client_side(message) -> None:
        if message["type"] == "http.response.start":
            counted_when_the_client_had_the_start.append(requests_counted())

    async def receive():
        return {"type": "http.request", "body": b""}

    app = HttpMetrics(endpoint, metrics)
    asyncio.run(app({"type": "http", "method": "GET", "path": "/x"}, receive, client_side))
    assert counted_when_the_client_had_the_start == [1.0]
    assert requests_counted() == 1.0  # once, not again at the end
