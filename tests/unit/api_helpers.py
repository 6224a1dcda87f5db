"""Helpers for the unit tests (the fixtures are in ``tests/unit/conftest.py``): projects and keys, submits, loop ticks, a job row."""

from __future__ import annotations

from sqlalchemy import func, select

from orchestrator.db.models import Job
from orchestrator.loops.reconciler import Reconciler
from orchestrator.loops.scheduler import Scheduler
from orchestrator.planner import plan_job
from orchestrator.repositories import jobs as jobs_repo
from orchestrator.repositories import projects as projects_repo
from workers.contract.jobs import JobSpec

ADMIN = "test-admin-token"


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def make_project(client, name: str) -> tuple[str, dict[str, str]]:
    """A project with a member, a viewer and the ids; returns (project_id, {role: key})."""
    project = client.post("/v1/projects", json={"name": name}, headers=auth(ADMIN))
    assert project.status_code == 201, project.text
    keys = {}
    for role in ("member", "viewer"):
        response = client.post(f"/v1/projects/{project.json()['id']}/keys", json={"role": role}, headers=auth(ADMIN))
        assert response.status_code == 201, response.text
        keys[role] = response.json()["key"]
    return project.json()["id"], keys


def submit(client, key, **spec):
    return client.post("/v1/jobs", json={"workload": "digits", **spec}, headers=auth(key))


def tick(app):
    service = app.state.service
    Scheduler(service.sessions, service.backend, service.settings).tick()


def reconcile(app):
    service = app.state.service
    Reconciler(service.sessions, service.backend, service.settings).tick()


def count_jobs(app) -> int:
    with app.state.service.sessions() as session:
        return session.scalar(select(func.count()).select_from(Job))


def new_job(sessions) -> str:
    """A QUEUED digits job in the default project, straight through the repository; returns its id."""
    with sessions.begin() as session:
        project = projects_repo.ensure_default_project(session)
        spec = JobSpec(workload="digits")
        return jobs_repo.create_job(session, project.id, spec, plan_job(spec), None).id
