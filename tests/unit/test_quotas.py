"""Quotas, fair share and the starvation guard through the API and the scheduler's tick, over the fake cluster,
on SQLite and PostgreSQL (docs/scheduling.md). The policy's own arithmetic is in test_scheduling_policy.py."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import update

from orchestrator.backend import RunStatus
from orchestrator.db.models import Job, JobEvent, JobState, utcnow
from orchestrator.loops.scheduler import Scheduler
from orchestrator_contract.jobs import DriverExit
from tests.unit.api_helpers import ADMIN, auth, make_project, reconcile, submit

ONE_CPU = {"num_workers": 1, "cpus_per_worker": 1}


def set_quota(client, project_id: str, **quota) -> dict:
    response = client.put(f"/v1/projects/{project_id}/quota", json=quota, headers=auth(ADMIN))
    assert response.status_code == 200, response.text
    return response.json()


def job(client, job_id: str) -> dict:
    return client.get(f"/v1/jobs/{job_id}", headers=auth(ADMIN)).json()


def scheduler(app) -> Scheduler:
    service = app.state.service
    return Scheduler(service.sessions, service.backend, service.settings)


def test_quota_is_set_by_a_cluster_admin_and_shown_on_the_project(client):
    project_id, keys = make_project(client, "vision")
    shown = client.get(f"/v1/projects/{project_id}", headers=auth(keys["member"])).json()
    assert shown["quota"] == {
        "max_cpus": None,
        "max_gpus": None,
        "max_running_jobs": None,
        "max_queued": None,
        "weight": 1.0,
        "borrowing": True,
        "per_cluster": {},
    }
    body = set_quota(client, project_id, max_cpus=8, max_gpus=2.5, max_running_jobs=3, weight=2, borrowing=False)
    assert body["quota"]["max_gpus"] == 2.5 and body["quota"]["weight"] == 2 and body["quota"]["borrowing"] is False
    assert client.get(f"/v1/projects/{project_id}", headers=auth(keys["viewer"])).json()["quota"] == body["quota"]
    # A project's own keys may not set it; bad values say which field.
    refused = client.put(f"/v1/projects/{project_id}/quota", json={"max_cpus": 1}, headers=auth(keys["member"]))
    assert refused.status_code == 403
    bad = client.put(f"/v1/projects/{project_id}/quota", json={"weight": 0}, headers=auth(ADMIN))
    assert bad.status_code == 422 and "weight" in bad.text
    assert client.put("/v1/projects/nope/quota", json={}, headers=auth(ADMIN)).status_code == 404
    # PUT replaces: what is left out goes back to its default.
    assert set_quota(client, project_id, max_cpus=4)["quota"]["max_gpus"] is None


def test_a_job_that_can_never_fit_its_quota_is_a_422_saying_what_to_change(client):
    project_id, keys = make_project(client, "vision")
    set_quota(client, project_id, max_cpus=1, borrowing=False)
    response = submit(client, keys["member"], scaling={"num_workers": 2, "cpus_per_worker": 1})
    assert response.status_code == 422, response.text
    assert "needs 2 CPU for 2 workers but project vision's quota is 1 CPUs (max_cpus)" in response.text
    assert "PUT /v1/projects/{id}/quota" in response.text
    # The same project allowed to borrow: accepted (it may run on idle capacity).
    set_quota(client, project_id, max_cpus=1, borrowing=True)
    assert submit(client, keys["member"], scaling={"num_workers": 2, "cpus_per_worker": 1}).status_code == 201


def test_more_than_max_queued_is_a_429_with_retry_after(client):
    project_id, keys = make_project(client, "vision")
    set_quota(client, project_id, max_queued=2)
    for _ in range(2):
        assert submit(client, keys["member"], scaling=ONE_CPU).status_code == 201
    full = submit(client, keys["member"], scaling=ONE_CPU)
    assert full.status_code == 429, full.text
    assert full.headers["Retry-After"] == "30"
    assert "already has 2 of 2 runs queued (max_queued)" in full.text
    sweep = client.post(
        "/v1/sweeps",
        json={
            "base": {"workload": "digits", "scaling": ONE_CPU},
            "search_space": {"lr.base": {"type": "choice", "values": [0.1]}},
        },
        headers=auth(keys["member"]),
    )
    assert sweep.status_code == 429
    # A replayed submit (same Idempotency-Key) is not a new run: it gets its job back, not a 429.
    set_quota(client, project_id, max_queued=3)
    headers = {**auth(keys["member"]), "Idempotency-Key": "k1"}
    keyed = client.post("/v1/jobs", json={"workload": "digits", "scaling": ONE_CPU}, headers=headers)
    assert keyed.status_code == 201
    assert submit(client, keys["member"], scaling=ONE_CPU).status_code == 429  # 3 of 3 queued now
    replay = client.post("/v1/jobs", json={"workload": "digits", "scaling": ONE_CPU}, headers=headers)
    assert replay.status_code == 200 and replay.json()["id"] == keyed.json()["id"]


def test_two_projects_with_one_cpu_quotas_each_run_one_job_at_a_time(app, client, backend):
    """The integration test's scenario on the fake cluster: 2 CPUs, quotas of 1 CPU, no borrowing, 2 one-CPU
    jobs each: one running per project, the second waiting with quota_exceeded and a message that says why."""
    backend.total = {"CPU": 2.0, "GPU": 0.0}
    jobs = {}
    for name in ("vision", "speech"):
        project_id, keys = make_project(client, name)
        set_quota(client, project_id, max_cpus=1, borrowing=False)
        jobs[name] = [submit(client, keys["member"], scaling=ONE_CPU).json()["id"] for _ in range(2)]
    scheduler(app).tick()
    for name, (first, second) in jobs.items():
        assert job(client, first)["state"] == "STARTING"
        waiting = job(client, second)
        assert waiting["state"] == "QUEUED" and waiting["reason"] == "quota_exceeded"
        assert waiting["message"] == f"project {name} uses 1 of 1 CPUs; this job needs 1 (borrowing is off)"
    assert len(backend.submitted) == 2


def test_a_project_borrows_idle_capacity_and_its_job_is_marked_borrowing(app, client, backend, sessions):
    project_id, keys = make_project(client, "vision")
    set_quota(client, project_id, max_cpus=1)  # borrowing on by default
    first, second = (submit(client, keys["member"], scaling=ONE_CPU).json()["id"] for _ in range(2))
    scheduler(app).tick()  # 4 idle CPUs
    assert job(client, first)["state"] == job(client, second)["state"] == "STARTING"
    with app.state.service.sessions() as session:
        assert session.get(Job, first).borrowing is False
        assert session.get(Job, second).borrowing is True


def test_fair_share_splits_the_cluster_between_projects_whatever_the_submit_order(app, client, backend):
    """a submits 4 one-CPU jobs before b submits 4: by one queue (priority then age) a would take all 4 CPUs."""
    ids = {}
    for name in ("a", "b"):
        _, keys = make_project(client, name)
        ids[name] = [submit(client, keys["member"], scaling=ONE_CPU).json()["id"] for _ in range(4)]
    scheduler(app).tick()
    started = {name: sum(job(client, j)["state"] == "STARTING" for j in js) for name, js in ids.items()}
    assert started == {"a": 2, "b": 2}


def test_a_starved_big_job_stops_small_ones_passing_it(app, client, backend):
    """1 of 4 CPUs stays busy; a 4-CPU job waits while 1-CPU jobs keep starting. Past starvation_s (the tick's
    clock moved on) the big job holds a reservation: the next small job waits, and the big one starts as soon
    as the running one is gone."""
    _, keys = make_project(client, "a")
    running = submit(client, keys["member"], scaling=ONE_CPU).json()["id"]
    scheduler(app).tick()
    big = submit(client, keys["member"], scaling={"num_workers": 4, "cpus_per_worker": 1}).json()["id"]
    small = submit(client, keys["member"], scaling=ONE_CPU).json()["id"]
    scheduler(app).tick()
    assert job(client, small)["state"] == "STARTING"  # passes the big one, which cannot fit
    later = submit(client, keys["member"], scaling=ONE_CPU).json()["id"]
    starvation_s = app.state.service.settings.starvation_s
    scheduler(app).tick(now=utcnow() + timedelta(seconds=starvation_s + 1))
    assert job(client, later)["state"] == "QUEUED"
    assert job(client, later)["message"] == "waiting for resources: needs 1 CPU, 0 free"
    assert "starvation guard" in job(client, big)["message"]
    for done in (running, small):
        client.post(f"/v1/jobs/{done}/cancel", headers=auth(ADMIN))
    with app.state.service.sessions.begin() as session:  # their Ray jobs are gone: ended
        session.execute(update(Job).where(Job.id.in_([running, small])).values(state="CANCELLED"))
    scheduler(app).tick(now=utcnow() + timedelta(seconds=starvation_s + 2))
    assert job(client, big)["state"] == "STARTING" and job(client, later)["state"] == "QUEUED"


def preempted_and_requeued(app, client, backend) -> tuple[str, str]:
    """On a 1-CPU cluster a priority-10 job preempts a running priority-0 one, which checkpoints, is requeued and
    waits while the high one runs. Returns (the requeued job, the high one)."""
    backend.total = {"CPU": 1.0, "GPU": 0.0}
    _, keys = make_project(client, "a")
    low = submit(client, keys["member"], scaling=ONE_CPU, priority=0).json()["id"]
    scheduler(app).tick()
    high = submit(client, keys["member"], scaling=ONE_CPU, priority=10).json()["id"]
    scheduler(app).tick()  # marks the low one
    backend.runs[f"{low}-1"] = RunStatus.FAILED  # its driver checkpointed and exited PREEMPTED
    backend.exit_codes[f"{low}-1"] = DriverExit.PREEMPTED
    reconcile(app)
    scheduler(app).tick()  # the high one is admitted; the low one waits
    assert (job(client, low)["state"], job(client, high)["state"]) == ("QUEUED", "STARTING")
    return low, high


def test_the_starvation_clock_of_a_preempted_job_starts_at_its_requeue(app, client, backend):
    """A job submitted two hours ago and requeued by a preemption just now does not claim the starvation guard's
    reservation: it has waited since its requeue (queued_at, set by the state engine), not since its submit."""
    low, _ = preempted_and_requeued(app, client, backend)
    with app.state.service.sessions.begin() as session:
        session.execute(update(Job).where(Job.id == low).values(created_at=utcnow() - timedelta(hours=2)))
    with app.state.service.sessions() as session:
        victim = session.get(Job, low)
        requeue = session.query(JobEvent).filter_by(job_id=low, to_state=JobState.QUEUED).order_by(JobEvent.id).all()
        assert len(requeue) == 2 and victim.queued_at == requeue[-1].created_at  # the submit, then the requeue
    starvation_s = app.state.service.settings.starvation_s
    plan = scheduler(app).tick(now=utcnow() + timedelta(seconds=60))
    assert plan.reserved_for is None and "starvation guard" not in job(client, low)["message"]
    plan = scheduler(app).tick(now=utcnow() + timedelta(seconds=starvation_s + 5))
    assert plan.reserved_for == f"job:{low}" and "starvation guard" in job(client, low)["message"]


def test_a_requeued_job_keeps_saying_it_was_preempted_while_it_waits_for_something_else(app, client, backend):
    """Once the scheduler notes what the requeued job waits for now (insufficient_resources), its reason says
    that, its message still starts with the preemption, and last_preempted_at/_by keep it, also once it runs
    again. A job never preempted answers null and '' (the fields are new, with defaults)."""
    low, high = preempted_and_requeued(app, client, backend)
    waiting = job(client, low)
    assert waiting["reason"] == "insufficient_resources", waiting
    assert waiting["message"].startswith(f"preempted by job {high} (priority 10) (priority); now waiting for resources")
    assert high in waiting["last_preempted_by"] and waiting["last_preempted_by"].endswith("(priority)")
    requeue = [
        e for e in client.get(f"/v1/jobs/{low}/events", headers=auth(ADMIN)).json() if e["reason"] == "preempted"
    ]
    assert len(requeue) == 1 and waiting["last_preempted_at"] == requeue[0]["created_at"]
    assert job(client, high)["last_preempted_at"] is None and job(client, high)["last_preempted_by"] == ""

    backend.runs[f"{high}-1"] = RunStatus.SUCCEEDED  # the high one is done; the low one runs again
    reconcile(app)
    scheduler(app).tick()
    again = job(client, low)
    assert again["state"] == "STARTING" and again["message"].startswith("attempt 2 submitted")
    assert (again["last_preempted_at"], again["last_preempted_by"]) == (
        waiting["last_preempted_at"],
        waiting["last_preempted_by"],
    )
    listed = client.get("/v1/jobs", headers=auth(ADMIN)).json()["items"]
    assert next(j for j in listed if j["id"] == low)["last_preempted_by"] == waiting["last_preempted_by"]


def test_a_higher_priority_job_asks_the_lower_priority_one_to_checkpoint_and_stop(app, client, backend):
    """The policy's preemption decision reaches preemption.preempt(): the victim is marked, the preemptor waits with
    reason preempting; nothing is asked of Ray by the scheduler for it."""
    backend.total = {"CPU": 1.0, "GPU": 0.0}
    _, keys = make_project(client, "a")
    low = submit(client, keys["member"], scaling=ONE_CPU, priority=0).json()["id"]
    scheduler(app).tick()
    high = submit(client, keys["member"], scaling=ONE_CPU, priority=10).json()["id"]
    plan = scheduler(app).tick()
    assert plan.preemption is not None and plan.preemption.victims == (f"job:{low}",)
    with app.state.service.sessions() as session:
        victim = session.get(Job, low)
        assert victim.preempt_requested_at is not None and high in victim.preempt_by
    waiting = job(client, high)
    assert waiting["state"] == "QUEUED" and waiting["reason"] == "preempting"
    # The next tick asks nobody else: the victim is already on its way out.
    again = scheduler(app).tick()
    assert again.preemption is not None
    assert job(client, high)["reason"] == "preempting"
    assert "stop" not in backend.asked


def test_a_higher_priority_job_over_its_quota_takes_it_back_from_a_lower_priority_one(app, client, backend):
    """The cluster has room (4 CPUs, 1 used) but the project's 1-CPU quota is full of low-priority work:
    preemption.choose_victims, told the quota's headroom as what is free, picks the low job."""
    project_id, keys = make_project(client, "vision")
    set_quota(client, project_id, max_cpus=1, borrowing=False)
    low = submit(client, keys["member"], scaling=ONE_CPU, priority=0).json()["id"]
    scheduler(app).tick()
    high = submit(client, keys["member"], scaling=ONE_CPU, priority=10).json()["id"]
    plan = scheduler(app).tick()
    assert plan.waits[f"job:{high}"][0] == "quota_exceeded"
    assert plan.preemption is not None and plan.preemption.victims == (f"job:{low}",)
    with app.state.service.sessions() as session:
        victim = session.get(Job, low)
        assert victim.preempt_requested_at is not None and "(priority)" in victim.preempt_by
    assert job(client, high)["reason"] == "preempting"


def test_a_sweep_counts_its_concurrent_trials_against_the_quota(app, client, backend):
    """A sweep holds max_concurrent_trials trials at their largest scaling: 2 x 1 CPU over a 1-CPU quota that
    may not borrow is a 422 naming max_concurrent_trials; within the quota it runs, and counts as a running
    job for max_running_jobs."""
    project_id, keys = make_project(client, "vision")
    set_quota(client, project_id, max_cpus=1, borrowing=False)
    body = {
        "base": {"workload": "digits", "scaling": ONE_CPU},
        "search_space": {"lr.base": {"type": "choice", "values": [0.1, 0.2]}},
        "max_concurrent_trials": 2,
    }
    refused = client.post("/v1/sweeps", json=body, headers=auth(keys["member"]))
    assert refused.status_code == 422, refused.text
    assert "max_concurrent_trials" in refused.text and "needs 2 CPU for 2 concurrent trial(s)" in refused.text
    set_quota(client, project_id, max_cpus=2, max_running_jobs=1, borrowing=False)
    sweep = client.post("/v1/sweeps", json=body, headers=auth(keys["member"])).json()
    job_id = submit(client, keys["member"], scaling={"num_workers": 1, "cpus_per_worker": 0.5}).json()["id"]
    scheduler(app).tick()
    assert client.get(f"/v1/sweeps/{sweep['id']}", headers=auth(ADMIN)).json()["state"] == "STARTING"
    assert job(client, job_id)["message"] == "project vision runs 1 of 1 jobs at once (max_running_jobs)"


def test_the_scheduler_remembers_who_just_used_the_cluster(app, client, backend):
    """The decayed share lives in the scheduler between ticks: project a held all 4 CPUs, its job has just
    ended; a and b then both queue a 4-CPU job, a's first: b's starts, since a's share is still near 1."""
    a_id, a_keys = make_project(client, "a")
    _, b_keys = make_project(client, "b")
    whole = {"num_workers": 4, "cpus_per_worker": 1}
    busy = submit(client, a_keys["member"], scaling=whole).json()["id"]
    one = scheduler(app)
    one.tick()
    a_next = submit(client, a_keys["member"], scaling=whole).json()["id"]
    one.tick()  # a holds the whole cluster: its share is 1
    with app.state.service.sessions.begin() as session:
        session.execute(update(Job).where(Job.id == busy).values(state="SUCCEEDED"))
    b_first = submit(client, b_keys["member"], scaling=whole).json()["id"]
    one.tick()
    assert job(client, b_first)["state"] == "STARTING" and job(client, a_next)["state"] == "QUEUED"
    # b's 4 CPUs now; a's share decays from 1 with a 600 s half-life: a fresh scheduler (a new leader) would
    # have started from 0 for a and admitted a's older job instead.
    assert one.shares[a_id] > 0.99


def test_a_borrowing_run_says_so(app, client, backend):
    """``borrowing`` on the job (and a sweep): admitted past its project's quota, on idle capacity."""
    project_id, keys = make_project(client, "vision")
    set_quota(client, project_id, max_cpus=1)
    first, second = (submit(client, keys["member"], scaling=ONE_CPU).json()["id"] for _ in range(2))
    assert job(client, first)["borrowing"] is False
    scheduler(app).tick()
    assert job(client, first)["borrowing"] is False and job(client, second)["borrowing"] is True
    listed = client.get("/v1/jobs", headers=auth(keys["member"])).json()["items"]
    assert {j["id"]: j["borrowing"] for j in listed} == {first: False, second: True}


def test_a_preempted_sweep_answers_its_last_preemption(sessions):
    """The same record for a sweep (its lifecycle shares the hook), in the API's SweepOut."""
    from api.views import sweep_out
    from orchestrator.db.models import Sweep
    from orchestrator.services.preemption import preempt, settle
    from orchestrator.services.runs import SWEEPS
    from orchestrator.states.sweeps import lock_sweep
    from tests.unit.test_preemption import running_sweep

    sweep_id = running_sweep(sessions)
    with sessions() as session:
        before = sweep_out(session.get(Sweep, sweep_id), {}, None)
        assert (before.last_preempted_at, before.last_preempted_by) == (None, "")
    assert preempt(sessions, sweep_id, "job abc (priority 10)", "priority", SWEEPS)
    with sessions.begin() as session:
        sweep = lock_sweep(session, sweep_id)
        settle(session, sweep, RunStatus.FAILED, grace_s=60, exit_code=DriverExit.PREEMPTED, kind=SWEEPS)
    with sessions() as session:
        sweep = session.get(Sweep, sweep_id)
        out = sweep_out(sweep, {}, None)
        assert out.last_preempted_at == sweep.queued_at is not None
        assert out.last_preempted_by == "job abc (priority 10) (priority)"
