"""Driving the dashboard (/ui) in the unit tests: sign in through the form, read the CSRF token a page
carries, post forms. Used by tests/unit/test_ui_*.py (the fixtures are tests/unit/conftest.py's)."""

from __future__ import annotations

import re

from tests.unit.api_helpers import ADMIN, auth

_HIDDEN_CSRF = re.compile(r'name="csrf_token" value="([^"]*)"')
_META_CSRF = re.compile(r'<meta name="csrf-token" content="([^"]*)"')


def login(client, key: str, next_url: str | None = None):
    """Sign in with ``key`` through the sign-in form (signed out first); returns the POST's answer (303 on
    success)."""
    client.cookies.clear()
    form = client.get("/ui/login")
    assert form.status_code == 200, form.text
    token = _HIDDEN_CSRF.search(form.text).group(1)
    data = {"api_key": key, "csrf_token": token}
    if next_url is not None:
        data["next"] = next_url
    return client.post("/ui/login", data=data, follow_redirects=False)


def signed_in(client, key: str):
    answer = login(client, key)
    assert answer.status_code == 303, answer.text
    return client


def csrf(client, page: str = "/ui/jobs") -> str:
    """The session's CSRF token, as the pages carry it."""
    answer = client.get(page)
    assert answer.status_code == 200, answer.text
    return _META_CSRF.search(answer.text).group(1)


def new_key(client, project_id: str, role: str) -> tuple[str, str]:
    """A key of ``role`` in the project: (id, secret)."""
    answer = client.post(f"/v1/projects/{project_id}/keys", json={"role": role}, headers=auth(ADMIN))
    assert answer.status_code == 201, answer.text
    return answer.json()["id"], answer.json()["key"]


def job_in(app, project_id: str | None = None, name: str = "", labels: dict | None = None) -> str:
    """A QUEUED digits job in the project (the default one if None), through the repository; returns its id."""
    from orchestrator.planner import plan_job
    from orchestrator.repositories import jobs as jobs_repo
    from orchestrator.repositories import projects as projects_repo
    from orchestrator_contract.jobs import JobSpec

    with app.state.service.sessions.begin() as session:
        project = project_id or projects_repo.ensure_default_project(session).id
        spec = JobSpec(workload="digits", name=name, labels=labels or {})
        return jobs_repo.create_job(session, project, spec, plan_job(spec), None).id


def move_job(app, job_id: str, *states, reason: str = "test", message: str = "") -> None:
    """Through the one transition function, a state at a time (admission starts attempt 1; each RESTARTING here
    is a new driver: attempt + 1)."""
    from orchestrator.db.models import JobState
    from orchestrator.states.jobs import lock_job, set_job_state

    for state in states:
        with app.state.service.sessions.begin() as session:
            job = lock_job(session, job_id)
            set_job_state(session, job, state, reason, message, new_attempt=state == JobState.RESTARTING)


def add_metrics(app, job_id: str, attempt: int, steps, values) -> None:
    """One metric point per step: ``values(step) -> {name: value}``, 10 steps an epoch."""
    from orchestrator.db.models import JobMetric

    with app.state.service.sessions.begin() as session:
        session.add_all(
            JobMetric(job_id=job_id, attempt=attempt, epoch=step // 10, step=step, values=values(step))
            for step in steps
        )


def add_checkpoint(app, tmp_path, job_id: str, epoch: int, accuracy: float) -> int:
    """A committed checkpoint whose folder holds a model (deployable once the job has ended)."""
    from orchestrator.db.models import Checkpoint

    folder = tmp_path / f"run-{job_id}" / f"checkpoint_{epoch}"
    folder.mkdir(parents=True)
    (folder / "model.pt").write_bytes(b"weights")
    with app.state.service.sessions.begin() as session:
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
        return checkpoint.id
