"""Deployments over a fake Serve, on SQLite and PostgreSQL: the API, the state rules, and the serving
reconciler's rollouts (promotion, a failed version falling back, rollback, delete, a lost Serve)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from sqlalchemy import func, select

from orchestrator.db.models import Checkpoint, Deployment, DeploymentState, Job, JobState
from orchestrator.loops.scheduler import Scheduler
from orchestrator.loops.serving import ServingReconciler, matches
from orchestrator.planner import plan_job
from orchestrator.repositories import jobs as jobs_repo
from orchestrator.repositories import projects as projects_repo
from orchestrator.scheduling.quotas import serving_holdings
from orchestrator.states.core import IllegalTransition
from orchestrator.states.deployments import TERMINAL, is_allowed, lock_deployment, set_deployment_state
from orchestrator.states.jobs import lock_job, set_job_state
from orchestrator_contract.jobs import JobSpec
from tests.fakes import FakeBackend
from tests.unit.api_helpers import ADMIN, auth, make_project

D = DeploymentState


# --- the state rules --------------------------------------------------------------------------------------

LEGAL = [
    (D.QUEUED, D.DEPLOYING),
    (D.QUEUED, D.UPDATING),
    (D.QUEUED, D.QUEUED),
    (D.QUEUED, D.DELETED),
    (D.DEPLOYING, D.QUEUED),
    (D.HEALTHY, D.QUEUED),
    (D.UPDATING, D.QUEUED),
    (D.UNHEALTHY, D.QUEUED),
    (D.FAILED, D.QUEUED),
    (D.DEPLOYING, D.HEALTHY),
    (D.DEPLOYING, D.FAILED),
    (D.DEPLOYING, D.DEPLOYING),
    (D.DEPLOYING, D.DELETED),
    (D.HEALTHY, D.UPDATING),
    (D.HEALTHY, D.UNHEALTHY),
    (D.HEALTHY, D.DELETED),
    (D.UPDATING, D.HEALTHY),
    (D.UPDATING, D.UNHEALTHY),
    (D.UPDATING, D.UPDATING),
    (D.UPDATING, D.DELETED),
    (D.UNHEALTHY, D.HEALTHY),
    (D.UNHEALTHY, D.UPDATING),
    (D.UNHEALTHY, D.DELETED),
    (D.FAILED, D.DEPLOYING),
    (D.FAILED, D.DELETED),
]
ILLEGAL = [
    (D.QUEUED, D.HEALTHY),
    (D.QUEUED, D.UNHEALTHY),
    (D.QUEUED, D.FAILED),
    (D.DEPLOYING, D.UPDATING),
    (D.DEPLOYING, D.UNHEALTHY),
    (D.HEALTHY, D.DEPLOYING),
    (D.HEALTHY, D.FAILED),
    (D.UPDATING, D.FAILED),
    (D.UPDATING, D.DEPLOYING),
    (D.UNHEALTHY, D.FAILED),
    (D.FAILED, D.HEALTHY),
    (D.FAILED, D.UPDATING),
]


@pytest.mark.parametrize(("src", "dst"), LEGAL)
def test_legal_transitions(src, dst):
    assert is_allowed(src, dst)


@pytest.mark.parametrize(("src", "dst"), ILLEGAL)
def test_illegal_transitions(src, dst):
    assert not is_allowed(src, dst)


def test_deleted_is_final():
    assert {D.DELETED} == TERMINAL
    assert not any(is_allowed(D.DELETED, other) for other in D)


# --- fixtures: a service over a fake cluster, and finished jobs with checkpoint folders ----------------------


@pytest.fixture
def settings_overrides() -> dict:
    return {"serve_port": 8123, "workload_packages": ""}


def finished_job(
    app,
    tmp_path: Path,
    project_id: str | None = None,
    accuracies=(0.80, 0.95, 0.90),
    *,
    state: JobState = JobState.SUCCEEDED,
    workload: str = "digits",
    files: bool = True,
) -> tuple[str, list[int]]:
    """A job of ``state`` with one checkpoint per epoch (val_accuracy from ``accuracies``), each a folder
    holding a model.pt (unless ``files`` is False). Returns the job id and the checkpoint ids."""
    sessions = app.state.service.sessions
    with sessions.begin() as session:
        project = project_id or projects_repo.ensure_default_project(session).id
        config = {"digits": {"hidden": 32}, "tiny_gpt": {"text_path": "t.txt"}}.get(workload, {})
        spec = JobSpec(workload=workload, config=config)
        job = jobs_repo.create_job(session, project, spec, plan_job(spec), None)
        job_id = job.id
    path = [JobState.STARTING, JobState.RUNNING] + ([state] if state != JobState.RUNNING else [])
    for to_state in path:
        with sessions.begin() as session:
            set_job_state(session, lock_job(session, job_id), to_state, "test")
    ids = []
    with sessions.begin() as session:
        for epoch, accuracy in enumerate(accuracies, start=1):
            folder = tmp_path / f"run-{job_id}" / f"checkpoint_{epoch}"
            if files:
                folder.mkdir(parents=True)
                (folder / "model.pt").write_bytes(b"weights")
            checkpoint = Checkpoint(
                job_id=job_id,
                attempt=1,
                epoch=epoch,
                step=10 * epoch,
                path=str(folder),
                size_bytes=7,
                metrics={"val_accuracy": accuracy},
            )
            session.add(checkpoint)
            session.flush()
            ids.append(checkpoint.id)
    return job_id, ids


def deploy(client, key=ADMIN, **body):
    return client.post("/v1/deployments", json=body, headers=auth(key))


def get(client, name, key=ADMIN) -> dict:
    response = client.get(f"/v1/deployments/{name}", headers=auth(key))
    assert response.status_code == 200, response.text
    return response.json()


def reconcile(app) -> None:
    service = app.state.service
    ServingReconciler(service.sessions, service.backend, service.settings).tick()


def app_of(backend: FakeBackend, name: str) -> dict:
    return next(a for a in backend.serve_applied[-1]["applications"] if a["name"] == name)


def healthy(app, client, backend, name: str, **body) -> dict:
    """Create, roll out and promote a deployment; returns it."""
    assert deploy(client, name=name, **body).status_code == 201
    service = app.state.service
    Scheduler(service.sessions, service.backend, service.settings).tick()  # admits one whose replicas hold CPUs
    reconcile(app)
    backend.serve_settle(name, "RUNNING")
    reconcile(app)
    deployment = get(client, name)
    assert deployment["state"] == "HEALTHY", deployment
    return deployment


# --- creating -------------------------------------------------------------------------------------------------


def test_deploying_a_job_serves_its_best_checkpoint(app, client, backend, tmp_path):
    job_id, checkpoints = finished_job(app, tmp_path, accuracies=(0.80, 0.95, 0.90))
    response = deploy(client, name="digits-a", source={"job_id": job_id})
    assert response.status_code == 201, response.text
    body = response.json()
    assert (body["state"], body["version"], body["serving_version"], body["current"]) == ("DEPLOYING", 1, None, None)
    assert body["url"] == "http://127.0.0.1:8123/digits-a" and body["route_prefix"] == "/digits-a"
    target = body["target"]
    assert target["checkpoint_id"] == checkpoints[1] and target["job_id"] == job_id  # the best, not the latest
    assert target["checkpoint"]["metrics"] == {"val_accuracy": 0.95} and target["checkpoint"]["epoch"] == 2
    assert target["settings"] == {
        "replicas": 1,
        "batching": {"max_batch_size": 16, "wait_ms": 2.0},
        "resources": {"cpus": 0.0, "gpus": 0.0},
        "auth": "project",
        "max_body_mb": 1.0,
    }
    assert (body["auth"], body["max_body_mb"]) == ("project", 1.0)
    latest = deploy(client, name="digits-b", source={"job_id": job_id, "select": "latest"}).json()
    assert latest["target"]["checkpoint_id"] == checkpoints[2]
    one = deploy(client, name="digits-c", source={"checkpoint_id": checkpoints[0]}).json()
    assert one["target"]["checkpoint_id"] == checkpoints[0]
    events = client.get("/v1/deployments/digits-a/events", headers=auth(ADMIN)).json()
    assert [(e["from_state"], e["to_state"], e["reason"], e["version"]) for e in events] == [
        (None, "DEPLOYING", "created", 1)
    ]
    assert [d["name"] for d in client.get("/v1/deployments", headers=auth(ADMIN)).json()] == [
        "digits-c",
        "digits-b",
        "digits-a",
    ]


def test_best_uses_the_jobs_keep_best_metric_when_it_set_one(app, client, tmp_path):
    job_id, checkpoints = finished_job(app, tmp_path, accuracies=(0.80, 0.95, 0.90))
    with app.state.service.sessions.begin() as session:
        job = session.get(Job, job_id)
        job.spec = {
            **job.spec,
            "checkpoint": {**job.spec["checkpoint"], "keep_best": {"metric": "val_accuracy", "mode": "min"}},
        }
    body = deploy(client, name="worst", source={"job_id": job_id}).json()
    assert body["target"]["checkpoint_id"] == checkpoints[0]


def test_best_by_a_metric_no_checkpoint_carries_is_a_422_naming_what_they_carry(app, client, tmp_path):
    # A regression workload reports val_mae, not the default val_accuracy: "best" must not quietly mean latest.
    job_id, checkpoints = finished_job(app, tmp_path, accuracies=(0.80, 0.95, 0.90))
    with app.state.service.sessions.begin() as session:
        for checkpoint in session.scalars(select(Checkpoint).where(Checkpoint.job_id == job_id)):
            checkpoint.metrics = {"val_mae": 1.0 - (checkpoint.metrics or {}).get("val_accuracy", 0.0)}
    refused = deploy(client, name="mae", source={"job_id": job_id})
    assert refused.status_code == 422 and "carries 'val_accuracy'" in refused.text and "val_mae" in refused.text
    assert refused.json()["detail"][0]["loc"][-1] == "metric"
    body = deploy(client, name="mae", source={"job_id": job_id, "metric": "val_mae", "mode": "min"}).json()
    assert body["target"]["checkpoint_id"] == checkpoints[1]


def test_settings_are_stored_with_every_default(app, client, tmp_path):
    job_id, _ = finished_job(app, tmp_path)
    body = deploy(
        client,
        name="auto",
        source={"job_id": job_id},
        route_prefix="/models/digits",
        replicas={"min": 1, "max": 3},
        batching={"max_batch_size": 32, "wait_ms": 5},
        resources={"cpus": 0.25},
    ).json()
    assert body["route_prefix"] == "/models/digits" and body["url"].endswith("/models/digits")
    assert body["target"]["settings"] == {
        "replicas": {"min": 1, "max": 3, "target_ongoing_requests": 32.0},
        "batching": {"max_batch_size": 32, "wait_ms": 5.0},
        "resources": {"cpus": 0.25, "gpus": 0.0},
        "auth": "project",
        "max_body_mb": 1.0,
    }
    off = deploy(client, name="unbatched", source={"job_id": job_id}, batching=None, replicas=2).json()
    assert off["target"]["settings"]["batching"] == {"max_batch_size": 1, "wait_ms": 0.0}
    assert off["target"]["settings"]["replicas"] == 2


@pytest.mark.parametrize(
    ("body", "loc", "words"),
    [
        ({"name": "Bad_Name", "source": {"job_id": "x"}}, ["body", "name"], "lowercase"),
        ({"name": "-x", "source": {"job_id": "x"}}, ["body", "name"], "lowercase"),
        ({"name": "x"}, ["body", "source"], "Field required"),
        ({"name": "x", "source": {}}, ["body", "source"], "exactly one of"),
        ({"name": "x", "source": {"job_id": "a", "checkpoint_id": 1}}, ["body", "source"], "exactly one of"),
        ({"name": "x", "source": {"checkpoint_id": 1, "select": "latest"}}, ["body", "source"], "job_id source only"),
        ({"name": "x", "source": {"job_id": "a"}, "route_prefix": "/-/routes"}, ["body", "route_prefix"], "'/-'"),
        ({"name": "x", "source": {"job_id": "a"}, "route_prefix": "/a/"}, ["body", "route_prefix"], "trailing"),
        (
            {"name": "x", "source": {"job_id": "a"}, "replicas": {"min": 3, "max": 2}},
            ["body", "replicas"],
            "must not exceed",
        ),
        ({"name": "x", "source": {"job_id": "a"}, "replicas": 0}, ["body", "replicas"], ""),
        ({"name": "x", "source": {"job_id": "a"}, "batching": {"max_batch_size": 0}}, ["body", "batching"], ""),
        ({"name": "x", "source": {"job_id": "a"}, "surprise": 1}, ["body", "surprise"], "Extra inputs"),
        (
            {"name": "x", "source": {"job_id": "a"}, "resources": {"gpus": 1}},
            ["body", "resources", "gpus"],
            "largest node has 0 GPU",
        ),
        ({"name": "x", "source": {"job_id": "nope"}}, ["body", "source", "job_id"], "no job nope"),
        ({"name": "x", "source": {"checkpoint_id": 999}}, ["body", "source", "checkpoint_id"], "no checkpoint 999"),
        ({"name": "x", "source": {"trial_id": "t1"}}, ["body", "source", "trial_id"], "no trial t1"),
    ],
)
def test_invalid_deployments_are_422_saying_what_to_fix(app, client, body, loc, words):
    response = deploy(client, **body)
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert any(d["loc"][: len(loc)] == loc and words in d["msg"] for d in detail), detail
    with app.state.service.sessions() as session:
        assert session.scalar(select(func.count()).select_from(Deployment)) == 0


def test_sources_that_cannot_be_served_are_422(app, client, tmp_path):
    running, _ = finished_job(app, tmp_path, state=JobState.RUNNING)
    response = deploy(client, name="x", source={"job_id": running})
    assert response.status_code == 422 and "is RUNNING" in response.text and "once it has ended" in response.text
    empty, _ = finished_job(app, tmp_path, accuracies=())
    assert "has no committed checkpoint" in deploy(client, name="x", source={"job_id": empty}).text
    gone, _ = finished_job(app, tmp_path, files=False)
    assert "no longer exists" in deploy(client, name="x", source={"job_id": gone}).text
    custom, _ = finished_job(app, tmp_path, workload="pkg.models:build")
    assert deploy(client, name="custom", source={"job_id": custom}).status_code == 201  # a classifier of rows


def test_names_and_routes_are_unique_among_live_deployments(app, client, tmp_path):
    job_id, _ = finished_job(app, tmp_path)
    assert deploy(client, name="a", source={"job_id": job_id}).status_code == 201
    taken = deploy(client, name="a", source={"job_id": job_id})
    assert taken.status_code == 409 and "already exists" in taken.json()["detail"]
    route = deploy(client, name="b", source={"job_id": job_id}, route_prefix="/a")
    assert route.status_code == 409 and "taken by deployment 'a'" in route.json()["detail"]
    assert client.delete("/v1/deployments/a", headers=auth(ADMIN)).status_code == 200
    again = deploy(client, name="a", source={"job_id": job_id})  # a deleted one's name is free again
    assert again.status_code == 201
    assert get(client, "a")["id"] == again.json()["id"]  # by name: the live one, not the deleted one


# --- roles and projects ------------------------------------------------------------------------------------------


def test_members_write_viewers_read_and_other_projects_see_nothing(app, client, tmp_path):
    vision_id, vision = make_project(client, "vision")
    _, speech = make_project(client, "speech")
    job_id, _ = finished_job(app, tmp_path, project_id=vision_id)
    assert deploy(client, vision["viewer"], name="v", source={"job_id": job_id}).status_code == 403
    created = deploy(client, vision["member"], name="v", source={"job_id": job_id})
    assert created.status_code == 201 and created.json()["project_id"] == vision_id
    assert get(client, "v", vision["viewer"])["name"] == "v"
    for method, path in [
        ("patch", "/v1/deployments/v"),
        ("post", "/v1/deployments/v/rollback"),
        ("delete", "/v1/deployments/v"),
    ]:
        kwargs = {"json": {"replicas": 2}} if method == "patch" else {}
        assert getattr(client, method)(path, headers=auth(vision["viewer"]), **kwargs).status_code == 403
        assert getattr(client, method)(path, headers=auth(speech["member"]), **kwargs).status_code == 404
    assert client.get("/v1/deployments/v", headers=auth(speech["member"])).status_code == 404
    assert client.get("/v1/deployments/v/events", headers=auth(speech["viewer"])).status_code == 404
    assert client.get("/v1/deployments", headers=auth(speech["viewer"])).json() == []
    # Another project's job is not a source either.
    stolen = deploy(client, speech["member"], name="s", source={"job_id": job_id})
    assert stolen.status_code == 422 and f"no job {job_id}" in stolen.text
    assert client.get("/v1/deployments/nope", headers=auth(ADMIN)).status_code == 404


# --- rolling out through the reconciler ----------------------------------------------------------------------


def test_a_deployment_becomes_healthy_when_serve_runs_its_version(app, client, backend, tmp_path):
    job_id, checkpoints = finished_job(app, tmp_path)
    deploy(client, name="digits", source={"job_id": job_id}, batching={"max_batch_size": 32, "wait_ms": 3})
    reconcile(app)
    config = backend.serve_applied[-1]
    assert config["http_options"] == {"host": "127.0.0.1", "port": 8123}
    application = app_of(backend, "digits")
    assert config["logging_config"] == application["logging_config"] == {"enable_access_log": False}
    assert application["import_path"] == "workers.serve.app:build_app" and application["route_prefix"] == "/digits"
    assert (
        application["args"]["checkpoint_path"].endswith("checkpoint_2") and application["args"]["workload"] == "digits"
    )
    assert application["args"]["config"]["hidden"] == 32
    options = application["deployments"][0]
    assert options["user_config"] == {
        "version": 1,
        "max_batch_size": 32,
        "batch_wait_timeout_s": 0.003,
        "threads": 1,
        "auth": "project",
        "key_hashes": [],
        "max_body_mb": 1.0,  # the project has no key of its own yet
    }
    assert options["max_ongoing_requests"] == 64 and options["num_replicas"] == 1
    assert options["ray_actor_options"] == {"num_cpus": 0.0, "num_gpus": 0.0} and options["max_surge_percent"] == 100
    assert get(client, "digits")["state"] == "DEPLOYING"  # Serve still deploying
    reconcile(app)
    assert len(backend.serve_applied) == 1  # nothing changed: nothing re-applied
    backend.serve_settle("digits", "RUNNING", replicas=1)
    reconcile(app)
    body = get(client, "digits")
    assert (body["state"], body["reason"], body["serving_version"]) == ("HEALTHY", "deployed", 1)
    assert body["current"]["checkpoint_id"] == checkpoints[1] and body["message"].startswith("version 1 serves at http")
    assert body["serve_status"] == "RUNNING" and body["replicas"] == [{"replica_id": "digits-r0", "state": "RUNNING"}]
    assert len(backend.serve_applied) == 1


def test_an_update_is_promoted_only_when_serve_runs_the_new_version(app, client, backend, tmp_path):
    job_id, checkpoints = finished_job(app, tmp_path)
    healthy(app, client, backend, "digits", source={"job_id": job_id})
    response = client.patch(
        "/v1/deployments/digits", json={"source": {"checkpoint_id": checkpoints[0]}}, headers=auth(ADMIN)
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["state"], body["version"], body["serving_version"]) == ("UPDATING", 2, 1)
    assert body["current"]["version"] == 1 and body["target"]["checkpoint_id"] == checkpoints[0]
    assert body["target"]["settings"] == body["current"]["settings"]  # only the source changed
    reconcile(app)
    assert app_of(backend, "digits")["deployments"][0]["user_config"]["version"] == 2
    assert app_of(backend, "digits")["args"]["checkpoint_path"].endswith("checkpoint_1")
    reconcile(app)
    assert get(client, "digits")["state"] == "UPDATING"  # Serve reports the new config but not RUNNING yet
    backend.serve_settle("digits", "RUNNING")
    reconcile(app)
    body = get(client, "digits")
    assert (body["state"], body["reason"], body["serving_version"]) == ("HEALTHY", "updated", 2)
    history = [
        (e["to_state"], e["reason"], e["version"])
        for e in client.get("/v1/deployments/digits/events", headers=auth(ADMIN)).json()
    ]
    assert history == [
        ("DEPLOYING", "created", 1),
        ("HEALTHY", "deployed", 1),
        ("UPDATING", "new_version", 2),
        ("HEALTHY", "updated", 2),
    ]


def test_a_version_that_fails_is_not_promoted_and_the_old_one_keeps_serving(app, client, backend, tmp_path):
    job_id, checkpoints = finished_job(app, tmp_path)
    healthy(app, client, backend, "digits", source={"job_id": job_id})
    client.patch("/v1/deployments/digits", json={"source": {"checkpoint_id": checkpoints[0]}}, headers=auth(ADMIN))
    reconcile(app)
    backend.serve_settle("digits", "DEPLOY_FAILED", message="The deployment failed to start 3 times in a row.")
    reconcile(app)
    body = get(client, "digits")
    assert (body["state"], body["reason"], body["version"], body["serving_version"]) == (
        "UNHEALTHY",
        "health_check_failed",
        2,
        1,
    )
    assert "version 2 was not promoted" in body["message"] and "failed to start 3 times" in body["message"]
    assert "Version 1 keeps serving" in body["message"]
    reconcile(app)  # the config goes back to version 1, whose replicas never stopped
    assert app_of(backend, "digits")["deployments"][0]["user_config"]["version"] == 1
    backend.serve_settle("digits", "RUNNING")
    reconcile(app)
    assert get(client, "digits")["state"] == "UNHEALTHY"  # until the user asks for something new
    # Rollback: back to the version before the newest, as version 3.
    response = client.post("/v1/deployments/digits/rollback", headers=auth(ADMIN))
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["state"], body["reason"], body["version"]) == ("UPDATING", "rollback", 3)
    assert body["target"]["note"] == "rollback to version 1" and body["target"]["checkpoint_id"] == checkpoints[1]
    reconcile(app)
    backend.serve_settle("digits", "RUNNING")
    reconcile(app)
    assert (get(client, "digits")["state"], get(client, "digits")["serving_version"]) == ("HEALTHY", 3)


def test_a_first_version_that_fails_is_failed_and_not_served(app, client, backend, tmp_path):
    job_id, checkpoints = finished_job(app, tmp_path)
    deploy(client, name="digits", source={"job_id": job_id})
    reconcile(app)
    backend.serve_settle("digits", "DEPLOY_FAILED", message="constructor raised")
    reconcile(app)
    body = get(client, "digits")
    assert (body["state"], body["reason"], body["serving_version"]) == ("FAILED", "health_check_failed", None)
    assert "version 1 failed" in body["message"] and "constructor raised" in body["message"]
    reconcile(app)
    assert backend.serve_applied[-1]["applications"] == []  # nothing to serve: removed
    assert client.post("/v1/deployments/digits/rollback", headers=auth(ADMIN)).status_code == 409  # only version 1
    patched = client.patch(
        "/v1/deployments/digits", json={"source": {"checkpoint_id": checkpoints[2]}}, headers=auth(ADMIN)
    )
    assert patched.json()["state"] == "DEPLOYING" and patched.json()["version"] == 2
    reconcile(app)
    backend.serve_settle("digits", "RUNNING")
    reconcile(app)
    assert get(client, "digits")["state"] == "HEALTHY"


def test_a_rollout_that_never_gets_healthy_times_out(app, client, backend, tmp_path):
    job_id, _ = finished_job(app, tmp_path)
    healthy(app, client, backend, "digits", source={"job_id": job_id})
    client.patch("/v1/deployments/digits", json={"replicas": 3}, headers=auth(ADMIN))
    reconcile(app)
    app.state.service.settings.serve_rollout_timeout_s = 0.01
    time.sleep(0.05)
    reconcile(app)  # Serve still DEPLOYING (replicas pending for resources, say)
    body = get(client, "digits")
    assert (body["state"], body["reason"], body["serving_version"]) == ("UNHEALTHY", "rollout_timeout", 1)
    assert "not healthy within 0.01 s (Serve reports DEPLOYING" in body["message"]


def test_settings_only_updates_and_patch_rules(app, client, backend, tmp_path):
    job_id, checkpoints = finished_job(app, tmp_path)
    healthy(app, client, backend, "digits", source={"job_id": job_id})
    body = client.patch("/v1/deployments/digits", json={"batching": None}, headers=auth(ADMIN)).json()
    assert body["target"]["settings"]["batching"] == {"max_batch_size": 1, "wait_ms": 0.0}
    assert body["target"]["checkpoint_id"] == checkpoints[1] and body["target"]["source"] == {
        "job_id": job_id,
        "select": "best",
    }
    reconcile(app)
    options = app_of(backend, "digits")["deployments"][0]
    assert options["user_config"]["max_batch_size"] == 1 and options["max_ongoing_requests"] == 64
    autoscale = client.patch(
        "/v1/deployments/digits", json={"replicas": {"min": 1, "max": 4}}, headers=auth(ADMIN)
    ).json()
    assert autoscale["target"]["settings"]["replicas"] == {"min": 1, "max": 4, "target_ongoing_requests": 1.0}
    reconcile(app)
    options = app_of(backend, "digits")["deployments"][0]
    assert "num_replicas" not in options
    assert options["autoscaling_config"] == {"min_replicas": 1, "max_replicas": 4, "target_ongoing_requests": 1.0}
    empty = client.patch("/v1/deployments/digits", json={}, headers=auth(ADMIN))
    assert empty.status_code == 422 and "nothing to change" in empty.text
    route = client.patch("/v1/deployments/digits", json={"route_prefix": "/other"}, headers=auth(ADMIN))
    assert route.status_code == 422 and "fixed at creation" in route.text
    tiny, _ = finished_job(app, tmp_path, workload="tiny_gpt")
    other = client.patch("/v1/deployments/digits", json={"source": {"job_id": tiny}}, headers=auth(ADMIN))
    assert other.status_code == 422 and "serves digits" in other.text


def test_delete_removes_the_application_and_keeps_the_record(app, client, backend, tmp_path):
    job_id, _ = finished_job(app, tmp_path)
    healthy(app, client, backend, "digits", source={"job_id": job_id})
    healthy(app, client, backend, "other", source={"job_id": job_id})
    response = client.delete("/v1/deployments/digits", headers=auth(ADMIN))
    assert response.status_code == 200 and response.json()["state"] == "DELETED"
    assert response.json()["serving_version"] is None and response.json()["deleted_at"]
    reconcile(app)
    assert [a["name"] for a in backend.serve_applied[-1]["applications"]] == ["other"]
    assert get(client, "digits")["state"] == "DELETED"
    assert [d["name"] for d in client.get("/v1/deployments", headers=auth(ADMIN)).json()] == ["other"]
    deleted = client.get("/v1/deployments", params={"state": "DELETED"}, headers=auth(ADMIN)).json()
    assert [d["name"] for d in deleted] == ["digits"]
    assert client.delete("/v1/deployments/digits", headers=auth(ADMIN)).status_code == 409
    assert client.patch("/v1/deployments/digits", json={"replicas": 2}, headers=auth(ADMIN)).status_code == 409
    assert client.post("/v1/deployments/digits/rollback", headers=auth(ADMIN)).status_code == 409


def test_after_a_ray_restart_every_live_deployment_is_applied_again(app, client, backend, tmp_path):
    job_id, _ = finished_job(app, tmp_path)
    healthy(app, client, backend, "digits", source={"job_id": job_id})
    before = backend.serve_applied[-1]
    backend.serve_apps.clear()  # Ray (and Serve with it) restarted: Serve reports nothing
    reconcile(app)
    assert backend.serve_applied[-1] == before  # the same config, from the database
    body = get(client, "digits")
    assert (body["state"], body["reason"]) == ("UNHEALTHY", "app_missing")
    backend.serve_settle("digits", "RUNNING")
    reconcile(app)
    assert (get(client, "digits")["state"], get(client, "digits")["reason"]) == ("HEALTHY", "recovered")


def test_a_restarted_control_plane_adopts_what_serve_runs(app, client, backend, tmp_path):
    job_id, _ = finished_job(app, tmp_path)
    healthy(app, client, backend, "digits", source={"job_id": job_id})
    applied = len(backend.serve_applied)
    service = app.state.service
    ServingReconciler(service.sessions, backend, service.settings).tick()  # a fresh reconciler, same DB
    assert len(backend.serve_applied) == applied and get(client, "digits")["state"] == "HEALTHY"


def test_serve_trouble_on_a_healthy_deployment_is_reported_then_recovered(app, client, backend, tmp_path):
    job_id, _ = finished_job(app, tmp_path)
    healthy(app, client, backend, "digits", source={"job_id": job_id})
    backend.serve_settle("digits", "UNHEALTHY", message="replica failed its health check")
    reconcile(app)
    body = get(client, "digits")
    assert (body["state"], body["reason"]) == ("UNHEALTHY", "replicas_unhealthy") and "health check" in body["message"]
    backend.serve_settle("digits", "RUNNING")
    reconcile(app)
    assert get(client, "digits")["state"] == "HEALTHY"


def test_an_unreachable_cluster_changes_nothing(app, client, backend, tmp_path):
    job_id, _ = finished_job(app, tmp_path)
    deploy(client, name="digits", source={"job_id": job_id})
    backend.available = False
    backend.asked.clear()
    reconcile(app)  # logs and waits for the next tick
    # Serve's status was asked for (and raised); with no answer, no config is pushed at a dead cluster.
    assert backend.asked == ["serve_status"]
    assert backend.serve_applied == [] and get(client, "digits")["state"] == "DEPLOYING"


def test_nothing_deployed_means_serve_is_never_asked(app, backend):
    backend.available = False  # every call raises, but is still recorded in backend.asked
    backend.asked.clear()
    reconcile(app)
    assert backend.asked == []  # not even Serve's status
    assert backend.serve_applied == []


def test_replicas_cpu_shares_count_against_training_admission(app, client, backend, tmp_path):
    job_id, _ = finished_job(app, tmp_path)
    healthy(app, client, backend, "free", source={"job_id": job_id})  # default: 0 CPU per replica
    healthy(
        app, client, backend, "paid", source={"job_id": job_id}, replicas={"min": 1, "max": 2}, resources={"cpus": 1}
    )
    with app.state.service.sessions() as session:
        # "paid": 1 CPU x 2 replicas at most; "free" asks nothing, so holds nothing.
        assert [dict(h.request) for h in serving_holdings(session)] == [{"CPU": 2.0, "GPU": 0.0}]
    waiting = client.post(
        "/v1/jobs", json={"workload": "digits", "scaling": {"num_workers": 3}}, headers=auth(ADMIN)
    ).json()
    service = app.state.service
    Scheduler(service.sessions, service.backend, service.settings).tick()
    body = client.get(f"/v1/jobs/{waiting['id']}", headers=auth(ADMIN)).json()
    assert body["state"] == "QUEUED" and body["message"] == "waiting for resources: needs 3 CPU, 2 free"


def test_replicas_count_against_their_projects_cpu_quota(app, client, backend, tmp_path):
    """A deployment's replicas (x most replicas) are its project's CPUs (docs/scheduling.md, "Deployments"):
    more than the quota, with borrowing off, is a 422 at create and update; within it, they leave the project's
    jobs less quota."""
    job_id, _ = finished_job(app, tmp_path)
    project = next(p for p in client.get("/v1/projects", headers=auth(ADMIN)).json() if p["name"] == "default")
    quota = {"max_cpus": 2, "borrowing": False}
    assert client.put(f"/v1/projects/{project['id']}/quota", json=quota, headers=auth(ADMIN)).status_code == 200
    refused = deploy(client, name="big", source={"job_id": job_id}, replicas=3, resources={"cpus": 1})
    assert refused.status_code == 422, refused.text
    assert "needs 3 CPU for 3 replicas but project default's quota is 2 CPUs (max_cpus)" in refused.text
    healthy(app, client, backend, "paid", source={"job_id": job_id}, replicas=2, resources={"cpus": 1})
    grow = client.patch("/v1/deployments/paid", json={"replicas": 4}, headers=auth(ADMIN))
    assert grow.status_code == 422 and "max_cpus" in grow.text
    waiting = client.post(
        "/v1/jobs", json={"workload": "digits", "scaling": {"num_workers": 1}}, headers=auth(ADMIN)
    ).json()
    service = app.state.service
    Scheduler(service.sessions, service.backend, service.settings).tick()
    body = client.get(f"/v1/jobs/{waiting['id']}", headers=auth(ADMIN)).json()
    assert body["state"] == "QUEUED" and body["reason"] == "quota_exceeded"
    assert body["message"] == "project default uses 2 of 2 CPUs; this job needs 1 (borrowing is off)"


def test_transition_function_records_history_and_refuses_illegal_moves(app, client, tmp_path):
    job_id, _ = finished_job(app, tmp_path)
    deployment_id = deploy(client, name="digits", source={"job_id": job_id}).json()["id"]
    sessions = app.state.service.sessions
    with sessions.begin() as session:
        deployment = lock_deployment(session, deployment_id)
        assert set_deployment_state(session, deployment, D.DEPLOYING, "again") is False  # a repeat is no news
        with pytest.raises(IllegalTransition):
            set_deployment_state(session, deployment, D.UPDATING, "nope")
        assert set_deployment_state(session, deployment, D.DELETED, "bye") is True
        assert deployment.deleted_at is not None and deployment.rollout_started_at is None


def test_serve_reports_numbers_as_floats_and_extra_keys():
    desired = {"a": 1, "b": {"c": [1, 2]}, "d": "x"}
    assert matches(desired, {"a": 1.0, "b": {"c": [1.0, 2], "e": 3}, "d": "x", "f": None})
    assert not matches(desired, {"a": 2, "b": {"c": [1, 2]}, "d": "x"})
    assert not matches({"a": True}, {"a": 1})


def test_the_live_name_index_allows_reuse_only_after_delete(sessions):
    from sqlalchemy.exc import IntegrityError

    from orchestrator.repositories import deployments as repo

    with sessions.begin() as session:
        project = projects_repo.ensure_default_project(session).id
        first = repo.create_deployment(session, project, "same", "digits", "/same")
        first.state = D.DELETED
    with sessions.begin() as session:
        repo.create_deployment(session, project, "same", "digits", "/same")
    with pytest.raises(IntegrityError), sessions.begin() as session:
        repo.create_deployment(session, project, "same", "digits", "/elsewhere")
