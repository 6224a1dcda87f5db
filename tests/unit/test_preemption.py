"""Preemption that checkpoints first (docs/scheduling.md, "Preemption"): the victim choice (pure), the state rules and
the reconciler's part on SQLite and PostgreSQL, and the flow over the API with a fake cluster."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select

from orchestrator.backend import RunStatus
from orchestrator.db.models import Job, JobEvent, JobState, Sweep, Trial, TrialState
from orchestrator.repositories import projects as projects_repo
from orchestrator.repositories import sweeps as sweeps_repo
from orchestrator.services.preemption import (
    Candidate,
    choose_victims,
    mark_preempted,
    preempt,
    preemption_candidates,
    priority_candidates,
    settle,
)
from orchestrator.services.runs import SWEEPS
from orchestrator.states.jobs import lock_job, set_job_state
from orchestrator.states.sweeps import lock_sweep, set_sweep_state, set_trial_state
from orchestrator_contract.jobs import DriverExit
from orchestrator_contract.sweeps import SweepSpec
from tests.unit.api_helpers import ADMIN, auth, make_project, new_job, reconcile, run_token, submit, tick

S = JobState
T0 = datetime(2026, 11, 26, 9, 0, tzinfo=UTC)


def cand(name: str, cpus: float = 1.0, priority: int = 0, age_s: int = 0, **fields) -> Candidate:
    """A candidate created ``age_s`` seconds before T0 (a larger age is older)."""
    return Candidate(
        id=name,
        project_id=fields.pop("project_id", "p"),
        priority=priority,
        created_at=T0 - timedelta(seconds=age_s),
        demand={"CPU": cpus, "GPU": fields.pop("gpus", 0.0)},
        **fields,
    )


NONE_FREE = {"CPU": 0.0, "GPU": 0.0}


def ids(victims) -> list[str] | None:
    return None if victims is None else [v.id for v in victims]


# --- the victim choice: a pure function -------------------------------------------------------------------


def test_lowest_priority_goes_first():
    pool = [cand("high", priority=5), cand("low", priority=-1), cand("mid", priority=0)]
    assert ids(choose_victims({"CPU": 1}, NONE_FREE, pool)) == ["low"]
    assert ids(choose_victims({"CPU": 2}, NONE_FREE, pool)) == ["low", "mid"]


def test_borrowing_goes_before_not_borrowing_at_the_same_priority():
    pool = [cand("own", age_s=0), cand("borrowed", age_s=100, borrowing=True)]
    assert ids(choose_victims({"CPU": 1}, NONE_FREE, pool)) == ["borrowed"]
    # ... but priority comes first
    pool = [cand("own", priority=-1), cand("borrowed", priority=0, borrowing=True)]
    assert ids(choose_victims({"CPU": 1}, NONE_FREE, pool)) == ["own"]


def test_youngest_goes_first_among_equals():
    pool = [cand("old", age_s=300), cand("young", age_s=10), cand("middle", age_s=100)]
    assert ids(choose_victims({"CPU": 1}, NONE_FREE, pool)) == ["young"]
    assert ids(choose_victims({"CPU": 2}, NONE_FREE, pool)) == ["young", "middle"]


def test_only_enough_victims_to_fit():
    # What is free counts: 1 free + 1 freed is enough for 2.
    pool = [cand("a", age_s=1), cand("b", age_s=2), cand("c", age_s=3)]
    assert ids(choose_victims({"CPU": 2}, {"CPU": 1.0, "GPU": 0.0}, pool)) == ["a"]
    # A small victim taken first whose share a bigger one covers alone is spared.
    pool = [cand("small", cpus=1, priority=-2), cand("big", cpus=3, priority=-1)]
    assert ids(choose_victims({"CPU": 3}, NONE_FREE, pool)) == ["big"]
    # A victim that frees nothing the run lacks (CPUs for a GPU shortfall) is never taken.
    pool = [cand("cpu-only", cpus=4, priority=-5), cand("gpu", cpus=1, gpus=1, priority=0)]
    assert ids(choose_victims({"CPU": 1, "GPU": 1}, {"CPU": 4.0, "GPU": 0.0}, pool)) == ["gpu"]
    # Fractional CPUs add up exactly enough.
    pool = [cand("x", cpus=0.5, age_s=1), cand("y", cpus=0.5, age_s=2), cand("z", cpus=0.5, age_s=3)]
    assert ids(choose_victims({"CPU": 1.0}, NONE_FREE, pool)) == ["x", "y"]


def test_never_a_non_preemptible_job():
    pool = [cand("exempt", priority=-10, preemptible=False), cand("other", priority=0)]
    assert ids(choose_victims({"CPU": 1}, NONE_FREE, pool)) == ["other"]
    assert choose_victims({"CPU": 1}, NONE_FREE, [cand("exempt", preemptible=False)]) is None


def test_nobody_for_a_run_that_would_not_fit_with_every_candidate_gone():
    pool = [cand("a", cpus=1), cand("b", cpus=1)]
    assert choose_victims({"CPU": 3}, NONE_FREE, pool) is None
    assert choose_victims({"CPU": 1, "GPU": 1}, NONE_FREE, pool) is None
    assert choose_victims({"CPU": 1}, NONE_FREE, []) is None


def test_nothing_new_when_it_fits_or_preemptions_under_way_free_enough():
    pool = [cand("a"), cand("b")]
    assert choose_victims({"CPU": 1}, {"CPU": 1.0, "GPU": 0.0}, pool) == []
    # One is already checkpointing and stopping: its CPU is on its way back, nobody else goes.
    pool = [cand("going", preempting=True), cand("b")]
    assert choose_victims({"CPU": 1}, NONE_FREE, pool) == []
    # ... and it is never chosen twice: one more is needed for 2.
    assert ids(choose_victims({"CPU": 2}, NONE_FREE, pool)) == ["b"]


def test_a_sweep_is_a_victim_like_a_job_in_the_same_order():
    """A sweep holding its concurrent trials is chosen by the same order: lowest priority, then borrowing,
    then youngest; its key (``sweep:<id>``) is how the scheduler's policy names it."""
    sweep = cand("sweep", cpus=2.0, priority=-1, kind="sweep")
    assert sweep.key == "sweep:sweep"
    pool = [cand("job", priority=0), sweep]
    assert ids(choose_victims({"CPU": 1}, NONE_FREE, pool)) == ["sweep"]  # the lower priority
    equal = [cand("old-job", age_s=100), cand("young-sweep", age_s=0, kind="sweep")]
    assert ids(choose_victims({"CPU": 1}, NONE_FREE, equal)) == ["young-sweep"]
    borrowing_job = [cand("job", age_s=0, borrowing=True), cand("sweep", age_s=100, kind="sweep")]
    assert ids(choose_victims({"CPU": 1}, NONE_FREE, borrowing_job)) == ["job"]
    exempt = [cand("sweep", cpus=2.0, kind="sweep", preemptible=False)]
    assert choose_victims({"CPU": 1}, NONE_FREE, exempt) is None


def test_the_priority_trigger_takes_only_lower_priority_jobs_of_the_same_project():
    pool = [
        cand("same-low", priority=0, project_id="p"),
        cand("same-equal", priority=5, project_id="p"),
        cand("other-low", priority=-9, project_id="q"),
    ]
    assert ids(priority_candidates(pool, "p", 5)) == ["same-low"]
    assert ids(choose_victims({"CPU": 1}, NONE_FREE, priority_candidates(pool, "p", 5))) == ["same-low"]
    assert choose_victims({"CPU": 2}, NONE_FREE, priority_candidates(pool, "p", 5)) is None


# --- the state rules and the reconciler's part (SQLite and PostgreSQL) ------------------------------------


def running_job(sessions) -> str:
    job_id = new_job(sessions)
    with sessions.begin() as session:
        job = lock_job(session, job_id)
        set_job_state(session, job, S.STARTING, "admitted")
        set_job_state(session, job, S.RUNNING, "training_started")
    return job_id


def test_a_preempted_job_goes_back_to_queued_with_its_attempt_and_says_by_whom(sessions):
    job_id = running_job(sessions)
    assert preempt(sessions, job_id, "job abc (priority 10)", "priority")
    assert not preempt(sessions, job_id, "job abc (priority 10)", "priority")  # already under way
    with sessions.begin() as session:
        job = lock_job(session, job_id)
        assert (job.state, job.reason) == (S.RUNNING, "preempting")
        assert job.preempt_requested_at is not None and "job abc" in job.message
        # Ray still runs it within the grace: nothing moves, nothing to stop.
        assert settle(session, job, RunStatus.RUNNING, grace_s=60) is False
        assert job.state == S.RUNNING
        # Its driver exited after the checkpoint: back to the queue.
        assert settle(session, job, RunStatus.FAILED, grace_s=60, exit_code=DriverExit.PREEMPTED) is False
    with sessions() as session:
        job = session.get(Job, job_id)
        assert (job.state, job.reason, job.attempt, job.preemptions) == (S.QUEUED, "preempted", 1, 1)
        assert "preempted by job abc (priority 10) (priority): checkpointed and stopped" in job.message
        assert job.preempt_requested_at is None and job.preempt_by == ""
        last = session.scalars(select(JobEvent).where(JobEvent.job_id == job_id).order_by(JobEvent.id.desc())).first()
        assert (last.from_state, last.to_state, last.reason, last.attempt) == (S.RUNNING, S.QUEUED, "preempted", 1)
    with sessions.begin() as session:  # admitted again: the next attempt
        job = lock_job(session, job_id)
        set_job_state(session, job, S.STARTING, "admitted")
        assert (job.attempt, job.preemptions) == (2, 1)


def test_a_victim_whose_run_finished_first_succeeds(sessions):
    job_id = running_job(sessions)
    assert preempt(sessions, job_id, "job abc", "priority")
    with sessions.begin() as session:
        job = lock_job(session, job_id)
        assert settle(session, job, RunStatus.SUCCEEDED, grace_s=60) is False
        assert (job.state, job.reason, job.preemptions) == (S.SUCCEEDED, "completed", 0)
        assert job.preempt_requested_at is None


def test_back_to_queued_only_preempted(sessions):
    job_id = running_job(sessions)
    with sessions.begin() as session:
        job = lock_job(session, job_id)
        with pytest.raises(ValueError, match="only 'preempted'"):
            set_job_state(session, job, S.QUEUED, "worker_died")
        session.rollback()


def test_cancelling_ended_and_non_preemptible_jobs_are_not_marked(sessions):
    cancelling = running_job(sessions)
    with sessions.begin() as session:
        set_job_state(session, lock_job(session, cancelling), S.CANCELLING, "cancel_requested")
    queued = new_job(sessions)
    exempt = running_job(sessions)
    with sessions.begin() as session:
        job = lock_job(session, exempt)
        job.spec = {**job.spec, "preemptible": False}
    for job_id in (cancelling, queued, exempt):
        assert not preempt(sessions, job_id, "someone", "priority"), job_id
    with sessions() as session:
        listed = {c.id: c for c in preemption_candidates(session)}
        assert set(listed) == {exempt} and listed[exempt].preemptible is False


def test_a_victim_that_does_not_stop_within_the_grace_is_stopped(sessions):
    job_id = running_job(sessions)
    with sessions.begin() as session:
        assert mark_preempted(session, lock_job(session, job_id), "job x", "priority")
    later = datetime.now(UTC) + timedelta(seconds=61)
    with sessions.begin() as session:
        job = lock_job(session, job_id)
        assert settle(session, job, RunStatus.RUNNING, grace_s=60, now=later) is True  # stop it
        assert settle(session, job, RunStatus.STOPPED, grace_s=60, now=later) is False
        assert (job.state, job.reason) == (S.QUEUED, "preempted")
        assert "stopped after" in job.message and "checkpointed" not in job.message


# --- sweeps: marked, requeued, their trials kept ----------------------------------------------------------

SWEEP_BODY = {
    "base": {"workload": "digits", "scaling": {"num_workers": 1, "cpus_per_worker": 1}},
    "search_space": {"lr.base": {"type": "choice", "values": [0.1, 0.2]}},
    "max_concurrent_trials": 2,
}


def running_sweep(sessions, **spec) -> str:
    """A RUNNING sweep with a finished trial and a running one; returns its id."""
    with sessions.begin() as session:
        project = projects_repo.ensure_default_project(session)
        sweep = sweeps_repo.create_sweep(session, project.id, SweepSpec.model_validate({**SWEEP_BODY, **spec}))
        set_sweep_state(session, sweep, S.STARTING, "admitted")
        set_sweep_state(session, sweep, S.RUNNING, "sweep_started")
        for tune_id, end in (("done", TrialState.SUCCEEDED), ("going", None)):
            trial = sweeps_repo.add_trial(session, sweep.id, tune_id, {"lr.base": 0.1})
            set_trial_state(session, trial, TrialState.RUNNING, "trial_started")
            if end is not None:
                set_trial_state(session, trial, end, "completed")
        return sweep.id


def test_a_marked_sweep_is_listed_with_its_trials_demand_and_settles_back_to_queued(sessions):
    sweep_id = running_sweep(sessions)
    with sessions() as session:
        listed = {c.key: c for c in preemption_candidates(session)}
    assert listed[f"sweep:{sweep_id}"].demand["CPU"] == 2.0  # 2 concurrent trials of 1 CPU
    assert preempt(sessions, sweep_id, "job abc (priority 10)", "priority", SWEEPS)
    assert not preempt(sessions, sweep_id, "job abc (priority 10)", "priority", SWEEPS)  # already under way
    with sessions.begin() as session:
        sweep = lock_sweep(session, sweep_id)
        assert (sweep.state, sweep.reason) == (S.RUNNING, "preempting")
        assert settle(session, sweep, RunStatus.RUNNING, grace_s=60, kind=SWEEPS) is False  # within the grace
        # A failure its driver reports while it is stopped is the stop itself (sweep_events): not applied here.
        assert (
            settle(session, sweep, RunStatus.FAILED, grace_s=60, exit_code=DriverExit.PREEMPTED, kind=SWEEPS) is False
        )
    with sessions() as session:
        sweep = session.get(Sweep, sweep_id)
        assert (sweep.state, sweep.reason, sweep.attempt, sweep.preemptions) == (S.QUEUED, "preempted", 1, 1)
        assert "preempted by job abc (priority 10) (priority): checkpointed and stopped" in sweep.message
        assert "unfinished trials resume" in sweep.message
        assert sweep.preempt_requested_at is None
        # Its trials are neither cancelled nor ended: the next attempt resumes the running one.
        trials = {t.tune_id: t.state for t in session.query(Trial).filter(Trial.sweep_id == sweep_id)}
        assert trials == {"done": TrialState.SUCCEEDED, "going": TrialState.RUNNING}
    with sessions.begin() as session:  # admitted again: attempt 2, not counted against its retries
        sweep = lock_sweep(session, sweep_id)
        set_sweep_state(session, sweep, S.STARTING, "admitted")
        assert (sweep.attempt, sweep.preemptions) == (2, 1)


def test_a_sweep_past_the_grace_is_stopped_and_a_non_preemptible_one_never_marked(sessions):
    sweep_id = running_sweep(sessions)
    with sessions.begin() as session:
        assert mark_preempted(session, lock_sweep(session, sweep_id), "job x", "priority")
    later = datetime.now(UTC) + timedelta(seconds=61)
    with sessions.begin() as session:
        sweep = lock_sweep(session, sweep_id)
        assert settle(session, sweep, RunStatus.RUNNING, grace_s=60, now=later, kind=SWEEPS) is True  # stop it
        assert settle(session, sweep, RunStatus.STOPPED, grace_s=60, now=later, kind=SWEEPS) is False
        assert (sweep.state, sweep.reason) == (S.QUEUED, "preempted")
        assert "stopped after" in sweep.message and "checkpointed" not in sweep.message
    exempt = running_sweep(sessions, preemptible=False)
    assert not preempt(sessions, exempt, "someone", "priority", SWEEPS)
    with sessions() as session:
        listed = {c.key: c for c in preemption_candidates(session)}
    assert listed[f"sweep:{exempt}"].preemptible is False


# --- over the API, with a fake cluster --------------------------------------------------------------------


# Long enough that a loaded machine never runs out the grace between two steps of a test; the grace test
# moves the request back in time instead of sleeping past it.
GRACE_S = 30.0


@pytest.fixture
def settings_overrides() -> dict:
    return {"preemption_grace_s": GRACE_S}


def started(app, client, backend, **spec) -> tuple[str, str]:
    job = submit(client, ADMIN, **spec).json()["id"]
    tick(app)
    return job, run_token(client, backend)


def events(client, job_id) -> list[tuple]:
    body = client.get(f"/v1/jobs/{job_id}/events", headers=auth(ADMIN)).json()
    return [(e["to_state"], e["reason"], e["attempt"]) for e in body]


def test_preemption_flow_over_the_api(app, client, backend):
    service = app.state.service
    job, token = started(app, client, backend, retries={"max_attempts": 2})
    run = {"attempt": 1, "events": [{"type": "state", "state": "running"}]}
    assert client.post(f"/internal/v1/jobs/{job}/events", json=run, headers=auth(token)).status_code == 200
    control = f"/internal/v1/jobs/{job}/control"
    assert client.get(control, params={"attempt": 1}, headers=auth(token)).json() == {
        "checkpoint_now": False,
        "stacks_wanted": None,
        "stop_trials": [],
        "trial_stacks_wanted": {},
        "end_workers": [],
    }

    assert preempt(service.sessions, job, "job hi (priority 9)", "priority")
    assert client.get(control, params={"attempt": 1}, headers=auth(token)).json() == {
        "checkpoint_now": True,
        "stacks_wanted": None,
        "stop_trials": [],
        "trial_stacks_wanted": {},
        "end_workers": [],
    }
    assert client.get(control, params={"attempt": 1}).status_code == 401  # the run's own token only
    assert client.get(control, params={"attempt": 1}, headers=auth(ADMIN)).status_code == 401
    assert client.get(control, params={"attempt": 2}, headers=auth(token)).status_code == 409
    # The stop's own failure, reported by the driver, is not a failure of the job.
    failed = {"attempt": 1, "events": [{"type": "state", "state": "failed", "reason": "worker_died"}]}
    assert client.post(f"/internal/v1/jobs/{job}/events", json=failed, headers=auth(token)).json()["applied"] == 0

    reconcile(app)  # Ray still runs it, within the grace: nothing stopped
    assert client.get(f"/v1/jobs/{job}", headers=auth(ADMIN)).json()["state"] == "RUNNING"
    assert backend.stopped == []
    backend.runs[f"{job}-1"] = RunStatus.FAILED  # the driver checkpointed and exited PREEMPTED
    backend.exit_codes[f"{job}-1"] = DriverExit.PREEMPTED
    reconcile(app)
    body = client.get(f"/v1/jobs/{job}", headers=auth(ADMIN)).json()
    assert (body["state"], body["attempt"], body["preemptions"]) == ("QUEUED", 1, 1)
    assert "checkpointed and stopped" in body["message"]
    assert ("QUEUED", "preempted", 1) in events(client, job)
    assert not any(e[0] in ("FAILED", "RESTARTING") for e in events(client, job))

    tick(app)  # admitted again: attempt 2, a new submission and a new token
    assert backend.submitted[-1][0] == f"{job}-2"
    assert client.get(control, params={"attempt": 1}, headers=auth(token)).status_code == 401
    # Its driver is lost: with max_attempts 2 it still has a retry, the preempted attempt not counted.
    backend.runs[f"{job}-2"] = RunStatus.FAILED
    reconcile(app)
    body = client.get(f"/v1/jobs/{job}", headers=auth(ADMIN)).json()
    assert (body["state"], body["reason"], body["attempt"]) == ("RESTARTING", "driver_failed", 3), body
    assert "starting attempt 2 of 2" in body["message"]


def test_a_victim_that_ignores_the_request_is_stopped_after_the_grace(app, client, backend):
    service = app.state.service
    job, token = started(app, client, backend)
    run = {"attempt": 1, "events": [{"type": "state", "state": "running"}]}
    client.post(f"/internal/v1/jobs/{job}/events", json=run, headers=auth(token))
    backend.runs[f"{job}-1"] = RunStatus.RUNNING
    assert preempt(service.sessions, job, "job hi", "priority")
    reconcile(app)
    assert backend.stopped == []
    with service.sessions.begin() as session:  # asked a grace and a second ago
        session.get(Job, job).preempt_requested_at -= timedelta(seconds=GRACE_S + 1)
    reconcile(app)  # stopped: the fake marks it STOPPED
    assert backend.stopped == [f"{job}-1"]
    reconcile(app)
    body = client.get(f"/v1/jobs/{job}", headers=auth(ADMIN)).json()
    assert (body["state"], body["reason"]) == ("QUEUED", "preempted") and "stopped after" in body["message"]
    assert body["preemptions"] == 1 and body["attempt"] == 1


def test_a_starting_victim_is_stopped_at_once(app, client, backend):
    service = app.state.service
    job, _ = started(app, client, backend)
    assert preempt(service.sessions, job, "job hi", "priority")
    reconcile(app)
    assert backend.stopped == [f"{job}-1"]
    reconcile(app)
    assert client.get(f"/v1/jobs/{job}", headers=auth(ADMIN)).json()["state"] == "QUEUED"


def test_only_an_admin_or_a_project_that_allows_it_submits_non_preemptible_jobs(app, client):
    project, keys = make_project(client, "exempt")
    refused = submit(client, keys["member"], preemptible=False)
    assert refused.status_code == 422, refused.text
    assert "preemptible" in refused.text and "allow_non_preemptible" in refused.text
    assert submit(client, keys["member"]).status_code == 201  # preemptible: the default
    assert submit(client, ADMIN, preemptible=False).status_code == 201  # a cluster-wide admin may
    patched = client.patch(f"/v1/projects/{project}", json={"allow_non_preemptible": True}, headers=auth(ADMIN))
    assert patched.status_code == 200 and patched.json()["allow_non_preemptible"] is True
    accepted = submit(client, keys["member"], preemptible=False)
    assert accepted.status_code == 201, accepted.text
    assert accepted.json()["spec"]["preemptible"] is False
    by_member = client.patch(
        f"/v1/projects/{project}", json={"allow_non_preemptible": True}, headers=auth(keys["member"])
    )
    assert by_member.status_code == 403


def test_a_higher_priority_job_preempts_a_sweep_over_the_api(app, client, backend):
    """The scheduler picks the sweep (2 of the 2 CPUs) for a job of its project with a higher priority; the sweep
    answers checkpoint_now on its own control endpoint (its token only); its driver's exit PREEMPTED requeues
    it; the job starts; the sweep is admitted again as attempt 2 once the job is done."""
    backend.total = {"CPU": 2.0, "GPU": 0.0}
    service = app.state.service
    _, keys = make_project(client, "tuning")
    sweep = client.post("/v1/sweeps", json=SWEEP_BODY, headers=auth(keys["member"])).json()["id"]
    tick(app)
    token = run_token(client, backend)
    control = f"/internal/v1/sweeps/{sweep}/control"
    running = {"attempt": 1, "events": [{"type": "state", "state": "running"}]}
    assert client.post(f"/internal/v1/sweeps/{sweep}/events", json=running, headers=auth(token)).status_code == 200
    assert client.get(control, params={"attempt": 1}, headers=auth(token)).json() == {
        "checkpoint_now": False,
        "stacks_wanted": None,
        "stop_trials": [],
        "trial_stacks_wanted": {},
        "end_workers": [],
    }

    high = submit(client, keys["member"], scaling={"num_workers": 1, "cpus_per_worker": 1}, priority=10).json()["id"]
    tick(app)
    assert client.get(f"/v1/jobs/{high}", headers=auth(ADMIN)).json()["reason"] == "preempting"
    assert client.get(control, params={"attempt": 1}, headers=auth(token)).json() == {
        "checkpoint_now": True,
        "stacks_wanted": None,
        "stop_trials": [],
        "trial_stacks_wanted": {},
        "end_workers": [],
    }
    assert client.get(control, params={"attempt": 1}, headers=auth(ADMIN)).status_code == 401
    assert client.get(control, params={"attempt": 2}, headers=auth(token)).status_code == 409
    failed = {"attempt": 1, "events": [{"type": "state", "state": "failed", "reason": "sweep_error"}]}
    assert client.post(f"/internal/v1/sweeps/{sweep}/events", json=failed, headers=auth(token)).json()["applied"] == 0

    backend.runs[f"{sweep}-1"] = RunStatus.FAILED  # the driver saved Tune's state and exited PREEMPTED
    backend.exit_codes[f"{sweep}-1"] = DriverExit.PREEMPTED
    reconcile(app)
    body = client.get(f"/v1/sweeps/{sweep}", headers=auth(ADMIN)).json()
    assert (body["state"], body["reason"], body["attempt"], body["preemptions"]) == ("QUEUED", "preempted", 1, 1)
    assert high in body["message"] and "checkpointed and stopped" in body["message"]
    tick(app)
    assert client.get(f"/v1/jobs/{high}", headers=auth(ADMIN)).json()["state"] == "STARTING"
    assert client.get(f"/v1/sweeps/{sweep}", headers=auth(ADMIN)).json()["state"] == "QUEUED"
    with service.sessions.begin() as session:  # the job is done
        set_job_state(session, lock_job(session, high), S.SUCCEEDED, "completed")
    tick(app)
    assert backend.submitted[-1][0] == f"{sweep}-2"


def test_only_an_admin_or_a_project_that_allows_it_submits_non_preemptible_sweeps(app, client):
    _, keys = make_project(client, "exempt-sweeps")
    for body in (
        {**SWEEP_BODY, "preemptible": False},
        {**SWEEP_BODY, "base": {**SWEEP_BODY["base"], "preemptible": False}},
    ):
        refused = client.post("/v1/sweeps", json=body, headers=auth(keys["member"]))
        assert refused.status_code == 422 and "allow_non_preemptible" in refused.text, refused.text
        assert client.post("/v1/sweeps", json=body, headers=auth(ADMIN)).status_code == 201
    searched = {**SWEEP_BODY, "search_space": {"preemptible": {"type": "choice", "values": [True, False]}}}
    assert client.post("/v1/sweeps", json=searched, headers=auth(ADMIN)).status_code == 422
