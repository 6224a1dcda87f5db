"""Deployments wait for their project's quota (docs/scheduling.md, "Deployments"), over the fake cluster and a fake
Serve, on SQLite and PostgreSQL: a new version whose replicas ask more CPUs than the deployment holds waits QUEUED with
the reason, and the scheduler admits it, by the policy that admits jobs, once it fits."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select, update

from orchestrator.admission import ClusterCapacity, Demand
from orchestrator.db.models import Job, UsageInterval, utcnow
from orchestrator.loops.scheduler import Scheduler
from orchestrator.scheduling.policy import Holding, ProjectQuota, Waiting, plan_tick
from tests.unit.api_helpers import ADMIN, auth, submit
from tests.unit.test_deployments import app_of, deploy, finished_job, get, healthy, reconcile

ONE_CPU = {"num_workers": 1, "cpus_per_worker": 1}


@pytest.fixture
def settings_overrides() -> dict:
    return {"serve_port": 8123, "workload_packages": ""}


def tick(app):
    service = app.state.service
    return Scheduler(service.sessions, service.backend, service.settings).tick()


def default_project(client) -> str:
    return next(p for p in client.get("/v1/projects", headers=auth(ADMIN)).json() if p["name"] == "default")["id"]


def set_quota(client, **quota) -> None:
    response = client.put(f"/v1/projects/{default_project(client)}/quota", json=quota, headers=auth(ADMIN))
    assert response.status_code == 200, response.text


def running_job(app, client, priority: int = 0) -> str:
    """A 1-CPU job of the default project, admitted (it holds its CPU from STARTING on)."""
    job_id = submit(client, ADMIN, scaling=ONE_CPU, priority=priority).json()["id"]
    tick(app)
    assert client.get(f"/v1/jobs/{job_id}", headers=auth(ADMIN)).json()["state"] == "STARTING"
    return job_id


def end(app, *job_ids: str) -> None:
    """The jobs' Ray jobs ended (as the reconciler would record it): their CPUs are free."""
    with app.state.service.sessions.begin() as session:
        session.execute(update(Job).where(Job.id.in_(job_ids)).values(state="SUCCEEDED"))


def job_state(client, job_id: str) -> str:
    return client.get(f"/v1/jobs/{job_id}", headers=auth(ADMIN)).json()["state"]


def history(client, name: str) -> list[tuple[str, str]]:
    events = client.get(f"/v1/deployments/{name}/events", headers=auth(ADMIN)).json()
    return [(e["to_state"], e["reason"]) for e in events]


def usage_rows(app, deployment_id: str) -> list[UsageInterval]:
    with app.state.service.sessions() as session:
        return list(session.scalars(select(UsageInterval).where(UsageInterval.subject_id == deployment_id)))


def test_a_new_deployment_over_its_quota_waits_queued_and_is_applied_once_it_fits(app, client, backend, tmp_path):
    job_id, _ = finished_job(app, tmp_path)
    set_quota(client, max_cpus=2, borrowing=False)
    training = running_job(app, client)
    created = deploy(client, name="paid", source={"job_id": job_id}, replicas=2, resources={"cpus": 1})
    assert created.status_code == 201, created.text
    body = created.json()
    assert (body["state"], body["reason"], body["serving_version"]) == ("QUEUED", "created", None)
    assert body["message"].startswith("queued version 1 from job") and "waiting for the scheduler" in body["message"]
    reconcile(app)
    assert backend.serve_applied == []  # nothing of it reaches Serve while it waits
    tick(app)
    body = get(client, "paid")
    assert (body["state"], body["reason"]) == ("QUEUED", "quota_exceeded")
    assert body["message"] == "project default uses 1 of 2 CPUs; this deployment needs 2 (borrowing is off)"
    assert usage_rows(app, body["id"]) == []  # a deployment that waits holds nothing

    end(app, training)
    tick(app)
    body = get(client, "paid")
    assert (body["state"], body["reason"]) == ("DEPLOYING", "admitted") and body["message"] == "deploying version 1"
    reconcile(app)
    assert app_of(backend, "paid")["deployments"][0]["ray_actor_options"]["num_cpus"] == 1
    backend.serve_settle("paid", "RUNNING")
    reconcile(app)
    assert get(client, "paid")["state"] == "HEALTHY"
    assert history(client, "paid") == [("QUEUED", "created"), ("DEPLOYING", "admitted"), ("HEALTHY", "deployed")]
    # Its replicas now hold the project's quota: the project's next job waits on it.
    waiting = submit(client, ADMIN, scaling=ONE_CPU).json()["id"]
    tick(app)
    waited = client.get(f"/v1/jobs/{waiting}", headers=auth(ADMIN)).json()
    assert waited["message"] == "project default uses 2 of 2 CPUs; this job needs 1 (borrowing is off)"


def test_an_update_that_must_wait_keeps_the_old_version_serving(app, client, backend, tmp_path):
    job_id, checkpoints = finished_job(app, tmp_path)
    set_quota(client, max_cpus=2, borrowing=False)
    healthy(app, client, backend, "paid", source={"job_id": job_id}, resources={"cpus": 1})
    training = running_job(app, client)
    grown = client.patch("/v1/deployments/paid", json={"replicas": 2}, headers=auth(ADMIN)).json()
    assert (grown["state"], grown["reason"], grown["version"], grown["serving_version"]) == (
        "QUEUED",
        "new_version",
        2,
        1,
    )
    assert grown["message"].endswith("; version 1 keeps serving")
    tick(app)
    body = get(client, "paid")
    assert (body["state"], body["reason"]) == ("QUEUED", "quota_exceeded")
    assert body["message"] == (
        "project default uses 2 of 2 CPUs; its version 2 needs 1 more than version 1 holds (borrowing is off); "
        "version 1 keeps serving"
    )
    reconcile(app)
    options = app_of(backend, "paid")["deployments"][0]
    assert options["user_config"]["version"] == 1 and options["num_replicas"] == 1  # Serve still runs version 1
    assert get(client, "paid")["state"] == "QUEUED"
    # Its usage goes on at what version 1 holds.
    open_rows = [u for u in usage_rows(app, body["id"]) if u.ended_at is None]
    assert [(u.attempt, u.workers, u.cpus) for u in open_rows] == [(1, 1, 1.0)]

    # A PATCH starts from the newest version's settings: back to 1 replica with a new checkpoint asks nothing more
    # than version 1 holds, and is rolled out at once, with no wait for the quota.
    back = {"source": {"checkpoint_id": checkpoints[0]}, "replicas": 1}
    same = client.patch("/v1/deployments/paid", json=back, headers=auth(ADMIN))
    assert (same.json()["state"], same.json()["version"]) == ("UPDATING", 3)
    reconcile(app)
    backend.serve_settle("paid", "RUNNING")
    reconcile(app)
    assert (get(client, "paid")["state"], get(client, "paid")["serving_version"]) == ("HEALTHY", 3)

    again = client.patch("/v1/deployments/paid", json={"replicas": 2}, headers=auth(ADMIN)).json()
    assert (again["state"], again["version"], again["serving_version"]) == ("QUEUED", 4, 3)
    end(app, training)
    tick(app)
    body = get(client, "paid")
    assert (body["state"], body["reason"]) == ("UPDATING", "admitted")
    assert body["message"] == "rolling out version 4; version 3 serves until it is healthy"
    reconcile(app)
    assert app_of(backend, "paid")["deployments"][0]["num_replicas"] == 2
    backend.serve_settle("paid", "RUNNING", replicas=2)
    reconcile(app)
    assert (get(client, "paid")["state"], get(client, "paid")["serving_version"]) == ("HEALTHY", 4)


def test_a_rollback_of_a_waiting_update_is_rolled_out_at_once(app, client, backend, tmp_path):
    """Rollback semantics are unchanged: a new version with the previous one's settings, which asks nothing more
    than the serving version holds."""
    job_id, _ = finished_job(app, tmp_path)
    set_quota(client, max_cpus=1, borrowing=False)
    healthy(app, client, backend, "paid", source={"job_id": job_id}, resources={"cpus": 1})
    assert client.patch("/v1/deployments/paid", json={"resources": {"cpus": 2}}, headers=auth(ADMIN)).status_code == 422
    # The project may not borrow and 2 CPUs is its whole quota: the bigger version waits for its one job to end.
    set_quota(client, max_cpus=2, borrowing=False)
    training = running_job(app, client)
    assert client.patch("/v1/deployments/paid", json={"replicas": 2}, headers=auth(ADMIN)).json()["state"] == "QUEUED"
    rolled = client.post("/v1/deployments/paid/rollback", headers=auth(ADMIN)).json()
    assert (rolled["state"], rolled["reason"], rolled["version"]) == ("UPDATING", "rollback", 3)
    assert rolled["target"]["settings"]["replicas"] == 1
    end(app, training)


def test_deleting_a_waiting_deployment(app, client, backend, tmp_path):
    job_id, _ = finished_job(app, tmp_path)
    set_quota(client, max_cpus=1, borrowing=False)
    running_job(app, client)
    assert deploy(client, name="paid", source={"job_id": job_id}, resources={"cpus": 1}).json()["state"] == "QUEUED"
    tick(app)
    deleted = client.delete("/v1/deployments/paid", headers=auth(ADMIN))
    assert deleted.status_code == 200 and deleted.json()["state"] == "DELETED"
    assert tick(app) is None  # nothing left to admit
    reconcile(app)
    assert backend.serve_applied == [] and "paid" not in backend.serve_apps
    assert history(client, "paid") == [("QUEUED", "created"), ("DELETED", "deleted")]
    # The name is free again, and one at 0 CPUs (the default) is never queued.
    assert deploy(client, name="paid", source={"job_id": job_id}).json()["state"] == "DEPLOYING"


def test_jobs_and_deployments_of_a_project_wait_in_one_queue_by_priority_then_age(app, client, backend, tmp_path):
    """A deployment waits as a run of priority 0 (a job's default): a job of higher priority goes first, one of
    the same priority by age. Quota: 1 CPU, no borrowing; everything asks 1 CPU."""
    job_id, _ = finished_job(app, tmp_path)
    set_quota(client, max_cpus=1, borrowing=False)
    blocker = running_job(app, client)
    assert deploy(client, name="paid", source={"job_id": job_id}, resources={"cpus": 1}).json()["state"] == "QUEUED"
    younger = submit(client, ADMIN, scaling=ONE_CPU).json()["id"]
    urgent = submit(client, ADMIN, scaling=ONE_CPU, priority=10).json()["id"]
    tick(app)
    assert get(client, "paid")["reason"] == "quota_exceeded"
    end(app, blocker)
    tick(app)
    assert (job_state(client, urgent), get(client, "paid")["state"], job_state(client, younger)) == (
        "STARTING",
        "QUEUED",
        "QUEUED",
    )
    end(app, urgent)
    tick(app)  # the deployment is older than the priority-0 job
    assert (get(client, "paid")["state"], job_state(client, younger)) == ("DEPLOYING", "QUEUED")
    client.delete("/v1/deployments/paid", headers=auth(ADMIN))
    tick(app)
    assert job_state(client, younger) == "STARTING"


def test_a_deployment_never_borrows_even_where_its_project_may(app, client, backend, tmp_path):
    """Borrowed capacity goes back to its owner by preemption, and replicas are never preempted: a deployment
    stays within its project's quota though the project's runs may borrow (and the fake cluster has 4 idle
    CPUs)."""
    job_id, _ = finished_job(app, tmp_path)
    set_quota(client, max_cpus=1)  # borrowing on by default
    refused = deploy(client, name="paid", source={"job_id": job_id}, replicas=2, resources={"cpus": 1})
    assert refused.status_code == 422, refused.text  # 2 CPUs can never fit a 1-CPU quota
    assert "can never run under its project's quota" in refused.text
    assert deploy(client, name="paid", source={"job_id": job_id}, resources={"cpus": 1}).status_code == 201
    tick(app)
    assert get(client, "paid")["state"] == "DEPLOYING"  # within its quota
    deploy(client, name="more", source={"job_id": job_id}, resources={"cpus": 1})
    tick(app)
    body = get(client, "more")
    assert (body["state"], body["reason"]) == ("QUEUED", "quota_exceeded")
    assert body["message"] == (
        "project default uses 1 of 1 CPUs; this deployment needs 1 "
        "(a deployment never borrows beyond its project's quota)"
    )
    # A job of the same project still borrows the idle CPUs.
    borrower = submit(client, ADMIN, scaling=ONE_CPU).json()["id"]
    tick(app)
    assert job_state(client, borrower) == "STARTING"
    assert client.get(f"/v1/jobs/{borrower}", headers=auth(ADMIN)).json()["borrowing"] is True


def test_a_deployment_waits_for_room_on_the_cluster_and_an_unreachable_one(app, client, backend, tmp_path):
    job_id, _ = finished_job(app, tmp_path)
    backend.total = {"CPU": 2.0, "GPU": 0.0}
    running_job(app, client)
    running_job(app, client)
    deploy(client, name="paid", source={"job_id": job_id}, resources={"cpus": 1})
    tick(app)
    body = get(client, "paid")
    assert (body["state"], body["reason"], body["message"]) == (
        "QUEUED",
        "insufficient_resources",
        "waiting for resources: needs 1 CPU, 0 free",
    )
    backend.available = False
    tick(app)
    assert get(client, "paid")["reason"] == "cluster_unavailable"


# --- the policy's part, without a database ------------------------------------------------------------------


def test_a_waiting_deployment_counts_against_no_max_running_jobs_and_preempts_nobody():
    now = utcnow()
    quota = ProjectQuota("p", max_cpus=2, max_running_jobs=1, borrowing=False)
    low = Holding("job:low", "p", {"CPU": 1.0}, priority=-5, started_at=now - timedelta(minutes=5))
    deployment = Waiting(
        "deployment:d",
        "p",
        0,
        now,
        Demand({"CPU": 1.0, "GPU": 0.0}, {"CPU": 1.0, "GPU": 0.0}, "1 replicas"),
        is_run=False,
        needs="this deployment needs {}",
    )
    capacity = ClusterCapacity({"CPU": 4.0, "GPU": 0.0}, {"CPU": 4.0, "GPU": 0.0})
    plan = plan_tick([deployment], [low], {"p": quota}, capacity, {}, now, 1800)
    assert plan.admit == [("deployment:d", False)]  # the project's one running job does not stop it
    bigger = Waiting(
        "deployment:d",
        "p",
        0,
        now,
        Demand({"CPU": 2.0, "GPU": 0.0}, {"CPU": 1.0, "GPU": 0.0}, "2 replicas"),
        is_run=False,
        needs="this deployment needs {}",
    )
    plan = plan_tick([bigger], [low], {"p": quota}, capacity, {}, now, 1800)
    assert plan.waits["deployment:d"] == (
        "quota_exceeded",
        "project p uses 1 of 2 CPUs; this deployment needs 2 (borrowing is off)",
    )
    assert plan.preemption is None  # the lower-priority job would give the quota back, but is not asked
    shrunk = ClusterCapacity({"CPU": 1.0, "GPU": 0.0}, {"CPU": 1.0, "GPU": 0.0})
    plan = plan_tick([bigger], [], {}, shrunk, {}, now, 1800)
    assert plan.fail == {} and plan.waits["deployment:d"][0] == "insufficient_resources"
