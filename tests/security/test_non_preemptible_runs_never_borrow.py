"""A run that may not be preempted never borrows, and cannot block preemption for others
(docs/security.md, "Preemption between projects").

Borrowed capacity goes back to its owner by preemption. A ``preemptible: false`` run that borrowed it kept it: the
policy counted it as a victim, ``preemption.choose_victims`` then refused it, and since the scheduler makes one
preemption a tick, the waiting run that named it took every tick's turn, so no other run ever got to preempt
anyone. Now such a run waits within its project's quota (``quota_exceeded``, with a message that says why), and
the policy never counts a non-preemptible run as a victim (one admitted borrowing before this fix included).

Over the unit-test app (a fake cluster) and the scheduler's tick, on SQLite and PostgreSQL.
"""

from __future__ import annotations

from sqlalchemy import update

from orchestrator.db.models import Job
from orchestrator.loops.scheduler import Scheduler
from tests.unit.api_helpers import ADMIN, auth, make_project, submit

ONE_CPU = {"num_workers": 1, "cpus_per_worker": 1}


def tick(app):
    service = app.state.service
    return Scheduler(service.sessions, service.backend, service.settings).tick()


def job(client, job_id: str) -> dict:
    return client.get(f"/v1/jobs/{job_id}", headers=auth(ADMIN)).json()


def exempt_project(client, name: str, **quota) -> dict[str, str]:
    """A project whose members may submit ``preemptible: false`` runs, with ``quota``."""
    project_id, keys = make_project(client, name)
    assert client.patch(
        f"/v1/projects/{project_id}", json={"allow_non_preemptible": True}, headers=auth(ADMIN)
    ).is_success
    if quota:
        assert client.put(f"/v1/projects/{project_id}/quota", json=quota, headers=auth(ADMIN)).is_success
    return keys


def test_a_non_preemptible_run_waits_within_its_projects_quota_instead_of_borrowing(app, client, backend):
    """On the old code the second job started with ``borrowing: true`` on the idle CPUs, capacity nobody could
    ever take back (``AssertionError: assert 'STARTING' == 'QUEUED'``), and a non-preemptible job bigger than
    the quota was accepted to wait forever."""
    backend.total = {"CPU": 4.0, "GPU": 0.0}
    keys = exempt_project(client, "exempt", max_cpus=1, borrowing=True)
    first = submit(client, keys["member"], scaling=ONE_CPU, preemptible=False).json()["id"]
    second = submit(client, keys["member"], scaling=ONE_CPU, preemptible=False).json()["id"]
    preemptible = submit(client, keys["member"], scaling=ONE_CPU).json()["id"]
    tick(app)
    assert job(client, first)["state"] == "STARTING" and job(client, first)["borrowing"] is False
    waiting = job(client, second)
    assert waiting["state"] == "QUEUED", waiting
    assert waiting["reason"] == "quota_exceeded"
    assert waiting["message"] == (
        "project exempt uses 1 of 1 CPUs; this job needs 1 "
        "(a run that may not be preempted never borrows beyond its project's quota)"
    )
    # The project's preemptible run still borrows the idle capacity.
    assert job(client, preemptible)["state"] == "STARTING" and job(client, preemptible)["borrowing"] is True
    # One that could never fit the quota is refused at submit, saying why, rather than waiting forever.
    bigger = submit(client, keys["member"], scaling={"num_workers": 2, "cpus_per_worker": 1}, preemptible=False)
    assert bigger.status_code == 422, bigger.text
    assert "a run that may not be preempted never borrows beyond its project's quota: ask for less" in bigger.text
    assert submit(client, keys["member"], scaling={"num_workers": 2, "cpus_per_worker": 1}).status_code == 201


def test_a_non_preemptible_run_that_borrowed_does_not_block_preemption_for_other_runs(app, client, backend):
    """A run of project d (which holds nothing) waits first in fair-share order and can only name project b's
    borrowing, non-preemptible run; project a's priority-10 job waits behind it for its own priority-0 job.
    On the old code the policy planned d's preemption every tick, choose_victims refused its only victim, and
    a's job never got its turn: ``AssertionError: Preemption(for_key='job:<d's job>', ..., eligible=(('job:<b's
    job>', 'quota'),), victims=('job:<b's job>',))`` where a's job was expected."""
    backend.total = {"CPU": 2.0, "GPU": 0.0}
    _, a = make_project(client, "a")
    b = exempt_project(client, "b")
    _, d = make_project(client, "d")
    low = submit(client, a["member"], scaling=ONE_CPU, priority=0).json()["id"]
    stuck = submit(client, b["member"], scaling=ONE_CPU, preemptible=False).json()["id"]
    tick(app)
    assert job(client, low)["state"] == job(client, stuck)["state"] == "STARTING"
    # Admitted borrowing before this fix (the scheduler no longer does that): the state an upgrade may find.
    with app.state.service.sessions.begin() as session:
        session.execute(update(Job).where(Job.id == stuck).values(borrowing=True))
    first_in_line = submit(client, d["member"], scaling=ONE_CPU).json()["id"]
    high = submit(client, a["member"], scaling=ONE_CPU, priority=10).json()["id"]

    plan = tick(app)
    assert plan.preemption is not None and plan.preemption.for_key == f"job:{high}", plan.preemption
    assert plan.preemption.victims == (f"job:{low}",)
    with app.state.service.sessions() as session:
        assert session.get(Job, low).preempt_requested_at is not None
        assert session.get(Job, stuck).preempt_requested_at is None
    assert job(client, high)["reason"] == "preempting"
    assert job(client, first_in_line)["reason"] == "insufficient_resources"
