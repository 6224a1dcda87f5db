"""Helpers for the unit tests (the fixtures are in ``tests/unit/conftest.py``): projects and keys, submits, loop ticks, a job row."""

from __future__ import annotations

import httpx
from sqlalchemy import func, select

from orchestrator.backend import RunStatus
from orchestrator.db.models import Job
from orchestrator.loops.reconciler import Reconciler
from orchestrator.loops.scheduler import Scheduler
from orchestrator.planner import plan_job
from orchestrator.repositories import jobs as jobs_repo
from orchestrator.repositories import projects as projects_repo
from orchestrator_contract.jobs import JobSpec

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


CLAIM_CODE_ENV = "ORCHESTRATOR_CLAIM_CODE"


def submission(backend, submission_id: str | None = None) -> tuple[str, str, dict]:
    """(submission id, entrypoint, env_vars) of a submission to the fake cluster: the last one, or ``submission_id``'s
    (its last submit)."""
    if submission_id is None:
        return backend.submitted[-1]
    return next(s for s in reversed(backend.submitted) if s[0] == submission_id)


def claim(post, submitted: tuple[str, str, dict], nonce: str, code: str | None = None):
    """What a driver does first: ``POST /internal/v1/{jobs|sweeps}/{id}/claim`` with its attempt's claim code (the
    submission's ``ORCHESTRATOR_CLAIM_CODE``, or ``code``). ``post``: a TestClient's or httpx's ``post``."""
    submission_id, entrypoint, env = submitted
    run_id, attempt = submission_id.rsplit("-", 1)
    collection = "sweeps" if "--sweep-id" in entrypoint else "jobs"
    return post(
        f"/internal/v1/{collection}/{run_id}/claim",
        json={"attempt": int(attempt), "nonce": nonce},
        headers=auth(code if code is not None else env[CLAIM_CODE_ENV]),
    )


def run_token(client, backend, submission_id: str | None = None) -> str:
    """The run's token for a submission's driver (the last one by default), claimed as the driver does at its start:
    once per claim code (the fake cluster remembers the token), so a test may ask again."""
    submitted = submission(backend, submission_id)
    code = submitted[2][CLAIM_CODE_ENV]
    if code not in backend.driver_tokens:
        response = claim(client.post, submitted, nonce=f"driver-of-{submitted[0]}")
        assert response.status_code == 200, response.text
        backend.driver_tokens[code] = response.json()["token"]
    return backend.driver_tokens[code]


def run_token_at(url: str, backend, submission_id: str | None = None) -> str:
    """``run_token`` from a control plane served at ``url`` (the ``live`` fixture, a uvicorn server)."""
    with httpx.Client(base_url=url, timeout=10) as http:
        return run_token(http, backend, submission_id)


def driver_exits(app, backend, submission_id: str | None = None, status=None, exit_code: int | None = None) -> None:
    """The driver of a submission (the last one by default) exits after its last report: Ray says its job ended
    (SUCCEEDED by default), and the reconciler sees it, applying the end the run reported (a run's own report of
    its end waits for Ray: orchestrator.services.reported_ends)."""
    submission_id = submission(backend, submission_id)[0]
    backend.runs[submission_id] = status or RunStatus.SUCCEEDED
    if exit_code is not None:
        backend.exit_codes[submission_id] = exit_code
    reconcile(app)


def tick(app):
    service = app.state.service
    Scheduler(service.sessions, service.backends, service.settings).tick()


def reconcile(app):
    service = app.state.service
    Reconciler(service.sessions, service.backends, service.settings).tick()


def count_jobs(app) -> int:
    with app.state.service.sessions() as session:
        return session.scalar(select(func.count()).select_from(Job))


def new_job(sessions) -> str:
    """A QUEUED digits job in the default project, straight through the repository; returns its id."""
    with sessions.begin() as session:
        project = projects_repo.ensure_default_project(session)
        spec = JobSpec(workload="digits")
        return jobs_repo.create_job(session, project.id, spec, plan_job(spec), None).id


def assert_one_made_and_the_rest_replayed(answers) -> None:
    """Of concurrent creates with one Idempotency-Key: no error, exactly one 201, every other a 200 marked
    ``Idempotent-Replayed``, and all of them the one object."""
    statuses = sorted(answer.status_code for answer in answers)
    problems = [answer.text for answer in answers if answer.status_code not in (200, 201)]
    assert not problems, f"statuses {statuses}; first problem: {problems[0]}"
    assert statuses.count(201) == 1, statuses
    assert all(answer.headers.get("Idempotent-Replayed") == "true" for answer in answers if answer.status_code == 200)
    assert len({answer.json()["id"] for answer in answers}) == 1


def blame_node(sessions, node_id: str, job_id: str, kinds: tuple[str, ...] = ("hung", "straggler")) -> None:
    """One fault per kind on ``node_id`` in ``job_id``'s name, as a hang and a straggler record them
    (``services.bad_nodes``): two make it a bad node."""
    from orchestrator.db.models import NodeFault

    with sessions.begin() as session:
        for kind in kinds:
            session.add(NodeFault(node_id=node_id, kind=kind, job_id=job_id, attempt=1, message=f"{kind} in {job_id}"))
