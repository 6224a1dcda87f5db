"""Start-up timelines (docs/jobs.md "Start-up timeline"): every attempt of a job or a sweep records when each stage
of its start was reached, the control plane's own stages (admitted, submitted, driver_started, assignment_fetched)
and those its run reports (``StartupEvent``), in order, by the control plane's clock; a re-sent event changes
nothing; a restarted attempt gets a timeline of its own; a trial records its own two. The control plane on the fake
cluster; the loop's side on one process (the real cluster: tests/integration/test_jobs_on_ray.py)."""

from __future__ import annotations

import pytest

from orchestrator_contract.jobs import RUN_STAGES, STARTUP_STAGES, RunStage
from tests.unit.api_helpers import ADMIN, auth, reconcile, run_token, submit, tick
from tests.unit.harness import MLP, job_config, train
from tests.unit.test_deadlines import SWEEP_BODY, running
from tests.unit.test_trial_deadlines import post_sweep, trial_event
from tests.unit.ui_helpers import signed_in


def post(client, job_id: str, token: str, attempt: int, *events: dict) -> None:
    response = client.post(
        f"/internal/v1/jobs/{job_id}/events", json={"attempt": attempt, "events": list(events)}, headers=auth(token)
    )
    assert response.status_code == 200, response.text


def stage(name: str) -> dict:
    return {"type": "startup", "stage": name}


def timelines(client, job_id: str) -> list[dict]:
    return client.get(f"/v1/jobs/{job_id}", headers=auth(ADMIN)).json()["startup"]


def started(app, client, backend, attempt: int = 1) -> tuple[str, str]:
    """A job admitted, submitted, its driver's token claimed and its assignment fetched: ``(job id, token)``."""
    job_id = submit(client, ADMIN).json()["id"]
    tick(app)
    token = run_token(client, backend)
    answer = client.get(f"/internal/v1/jobs/{job_id}/assignment", params={"attempt": attempt}, headers=auth(token))
    assert answer.status_code == 200, answer.text
    return job_id, token


def test_an_attempt_records_every_stage_of_its_start_in_order(app, client, backend):
    assert typing_stages() == RUN_STAGES
    job_id = submit(client, ADMIN).json()["id"]
    assert timelines(client, job_id) == []  # queued: no attempt yet
    tick(app)
    (first,) = timelines(client, job_id)
    assert [s["stage"] for s in first["stages"]] == ["admitted", "submitted"], first
    token = run_token(client, backend)
    client.get(f"/internal/v1/jobs/{job_id}/assignment", params={"attempt": 1}, headers=auth(token))
    post(client, job_id, token, 1, stage("trainer_started"), stage("workers_up"))
    post(client, job_id, token, 1, {"type": "state", "state": "running"}, stage("training_started"))
    post(client, job_id, token, 1, stage("data_ready"), stage("first_step"))

    (timeline,) = timelines(client, job_id)
    assert timeline["attempt"] == 1
    assert [s["stage"] for s in timeline["stages"]] == list(STARTUP_STAGES)
    after = [s["after_s"] for s in timeline["stages"]]
    assert after[0] == 0.0 and after == sorted(after), timeline
    assert timeline["first_step_s"] == after[-1]

    # A re-sent event (a retried batch) keeps the first time.
    before = timelines(client, job_id)
    post(client, job_id, token, 1, stage("first_step"), stage("workers_up"))
    assert timelines(client, job_id) == before


def test_a_restarted_attempt_gets_a_timeline_of_its_own(app, client, backend):
    job_id, token = started(app, client, backend)
    post(client, job_id, token, 1, {"type": "state", "state": "running"}, stage("first_step"))
    del backend.runs[f"{job_id}-1"]  # the driver went away: attempt 2 starts at once
    reconcile(app)
    first, second = timelines(client, job_id)
    assert (first["attempt"], second["attempt"]) == (1, 2)
    assert first["first_step_s"] is not None
    assert [s["stage"] for s in second["stages"]] == ["admitted", "submitted"] and second["first_step_s"] is None
    assert second["stages"][0]["at"] >= first["stages"][-1]["at"]
    token = run_token(client, backend)
    post(client, job_id, token, 2, stage("first_step"))
    assert timelines(client, job_id)[1]["first_step_s"] is not None


def test_a_stage_no_run_reports_is_refused(app, client, backend):
    job_id, token = started(app, client, backend)
    for bad in ("admitted", "lunch", ""):
        response = client.post(
            f"/internal/v1/jobs/{job_id}/events",
            json={"attempt": 1, "events": [stage(bad)]},
            headers=auth(token),
        )
        assert response.status_code == 422, (bad, response.text)


def test_the_job_page_shows_the_latest_attempts_start(app, client, backend):
    job_id, token = started(app, client, backend)
    post(client, job_id, token, 1, {"type": "state", "state": "running"}, stage("first_step"))
    signed_in(client, ADMIN)
    page = client.get(f"/ui/jobs/{job_id}")
    assert page.status_code == 200, page.text
    assert "first step after" in page.text and "assignment_fetched" in page.text


def test_a_sweep_and_its_trial_record_their_starts(app, client, backend):
    sweep_id, token = running(app, client, backend, "sweeps", **SWEEP_BODY)
    post_sweep(client, sweep_id, token, {"type": "startup", "stage": "trainer_started"})
    sweep = client.get(f"/v1/sweeps/{sweep_id}", headers=auth(ADMIN)).json()
    (timeline,) = sweep["startup"]
    assert [s["stage"] for s in timeline["stages"]] == ["admitted", "submitted", "driver_started", "trainer_started"]

    post_sweep(client, sweep_id, token, trial_event("t1", "running", config={"lr.base": 0.1}))
    post_sweep(client, sweep_id, token, trial_event("t1", "running", epoch=1, step=10, metrics={"val_loss": 1.0}))
    post_sweep(client, sweep_id, token, trial_event("t1", "running", epoch=2, step=20, metrics={"val_loss": 0.9}))
    (trial,) = client.get(f"/v1/sweeps/{sweep_id}/trials", headers=auth(ADMIN)).json()
    stages = trial["startup"]
    assert [s["stage"] for s in stages] == ["trial_started", "first_result"], stages
    assert stages[0]["after_s"] == 0.0 and stages[1]["after_s"] >= 0.0


@pytest.mark.parametrize("workers", [1])
def test_the_loop_reports_its_stages_in_order_once(tmp_path, workers):
    config = job_config(MLP, workers=workers, epochs=2)
    events = train(config, tmp_path)["events"]
    stages = [event["stage"] for event in events if event.get("type") == "startup"]
    assert stages == ["training_started", "data_ready", "first_step"]
    first_metrics = next(i for i, event in enumerate(events) if event.get("type") == "metrics")
    assert max(i for i, event in enumerate(events) if event.get("type") == "startup") < first_metrics


def typing_stages() -> tuple[str, ...]:
    import typing

    return typing.get_args(RunStage)
