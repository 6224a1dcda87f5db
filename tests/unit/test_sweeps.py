"""Sweeps without Ray: the spec's checks, its translation for Ray Tune, and the API, scheduler, reconciler
and sweep-driver endpoints over a fake cluster, on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from orchestrator.admission import ClusterCapacity, never_fits, sweep_demand
from orchestrator.backend import RunStatus
from tests.unit.api_helpers import ADMIN, auth, make_project, reconcile, submit, tick
from workers.sweep_spec import SweepSpec, trial_spec

BASE = {"workload": "digits", "epochs": 4, "scaling": {"num_workers": 2, "cpus_per_worker": 0.5}}
LR = {"lr.base": {"type": "loguniform", "low": 1e-3, "high": 0.3}}


def sweep_spec(**fields) -> dict:
    return {"base": BASE, "search_space": LR, **fields}


# --- the spec ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"search_space": {"lr.base": {"type": "uniform", "low": 0.3, "high": 0.1}}}, "low (0.3) must be below high (0.1)"),
        ({"search_space": {"lr.base": {"type": "loguniform", "low": 0, "high": 0.1}}}, "loguniform needs low > 0"),
        ({"search_space": {"optimizer.lr": {"type": "choice", "values": [1]}}}, "no field 'lr' in the base spec"),
        ({"search_space": {"config.depth": {"type": "choice", "values": [1]}}}, "no field 'depth'"),
        ({"search_space": {"workload": {"type": "choice", "values": ["tiny_gpt"]}}}, "workload is fixed for a sweep"),
        ({"search_space": {"config.hidden": {"type": "choice", "values": [64, 0]}}}, "value 0 makes an invalid job"),
        ({"search_space": {"optimizer.name": {"type": "grid", "values": ["sgd", "lamb"]}}}, "value 'lamb' makes an invalid job"),
        ({"search_space": {"batch.per_worker": {"type": "randint", "low": 8, "high": 8}}}, "randint needs low < high"),
        ({"metric": "accuracy"}, "metric"),
        ({"algorithm": "optuna", "search_space": {"lr.base": {"type": "grid", "values": [0.1, 0.2]}}}, "cannot walk a grid"),
        ({"algorithm": "grid"}, "algorithm grid needs every dimension of type grid"),
        ({"scheduler": {"type": "asha", "max_t": 2, "grace_period": 3}}, "grace_period (3) must be at most max_t (2)"),
        ({"scheduler": {"type": "asha", "max_t": 10}}, "scheduler.max_t (10) is more than base.epochs (4)"),
        ({"scheduler": {"type": "pbt"}}, "scheduler"),
        ({"base": {**BASE, "checkpoint": {"every_steps": 5}}}, "a trial checkpoints every epoch"),
        ({"search_space": {}}, "search_space"),
        ({"search_space": {"strategy": {"type": "choice", "values": ["ddp", "auto"]}}}, "search those, not auto"),
    ],
)
def test_invalid_sweeps_say_what_is_wrong(fields, expected):
    with pytest.raises(ValidationError) as caught:
        SweepSpec.model_validate(sweep_spec(**fields))
    assert expected in str(caught.value)


def test_defaults_trial_counts_and_the_worst_case_trial():
    spec = SweepSpec.model_validate(sweep_spec())
    assert (spec.algorithm, spec.scheduler.type, spec.metric, spec.mode, spec.num_samples) == (
        "random", "fifo", "val_accuracy", "max", 8
    )
    assert SweepSpec.model_validate(sweep_spec(metric="val_loss")).mode == "min"
    grid = SweepSpec.model_validate(sweep_spec(
        algorithm="random", num_samples=2,
        search_space={"config.hidden": {"type": "grid", "values": [16, 32, 64]}, "lr.base": {"type": "grid", "values": [0.1, 0.2]}},
    ))
    assert grid.total_trials == 12 and grid.concurrency == 2
    assert SweepSpec.model_validate(sweep_spec(search_space={"lr.base": {"type": "grid", "values": [0.1]}})).num_samples == 1
    scaled = SweepSpec.model_validate(sweep_spec(search_space={"scaling.num_workers": {"type": "choice", "values": [1, 3, 2]}}))
    assert scaled.worst_case_trial().scaling.num_workers == 3


def test_a_trial_spec_is_the_base_with_the_searched_paths_set():
    spec = SweepSpec.model_validate(sweep_spec())
    trial = trial_spec(spec.base, {"lr.base": 0.01, "config.hidden": 16, "batch.per_worker": 8})
    assert (trial.lr.base, trial.config["hidden"], trial.batch.per_worker) == (0.01, 16, 8)
    assert trial.epochs == spec.base.epochs and spec.base.config["hidden"] == 128  # the base is untouched


def test_the_search_space_in_ray_tune_terms():
    from ray.tune.search.sample import Categorical, Float, Integer

    from workers.tuning import param_space

    spec = SweepSpec.model_validate(sweep_spec(search_space={
        "lr.base": {"type": "loguniform", "low": 1e-3, "high": 0.3},
        "lr.warmup_steps": {"type": "randint", "low": 0, "high": 10},
        "optimizer.momentum": {"type": "quniform", "low": 0.5, "high": 0.9, "q": 0.1},
        "config.hidden": {"type": "choice", "values": [16, 32]},
    }))
    space = param_space(spec)
    assert isinstance(space["lr.base"], Float) and isinstance(space["lr.warmup_steps"], Integer)
    assert isinstance(space["config.hidden"], Categorical) and space["config.hidden"].categories == [16, 32]
    samples = [space["lr.base"].sample() for _ in range(200)]
    assert 1e-3 <= min(samples) and max(samples) <= 0.3
    assert all(0 <= space["lr.warmup_steps"].sample() < 10 for _ in range(50))


def test_a_sweep_reserves_its_concurrent_trials():
    spec = SweepSpec.model_validate(sweep_spec(max_concurrent_trials=3))
    demand = sweep_demand(spec)
    assert demand.total["CPU"] == pytest.approx(3 * (2 * 0.5 + 0.01))
    assert never_fits(demand, ClusterCapacity({"CPU": 2, "GPU": 0}, {"CPU": 2, "GPU": 0})) == (
        "needs 3.03 CPU for 3 concurrent trial(s) of 2 workers (lower max_concurrent_trials to fit) "
        "but the whole cluster has 2 CPU"
    )
    # Never more than the sweep's trials at once.
    one = SweepSpec.model_validate(sweep_spec(num_samples=1, max_concurrent_trials=3))
    assert sweep_demand(one).total["CPU"] == pytest.approx(1.01)


# --- the API over a fake cluster ---------------------------------------------------------------------


def post_sweep(client, key=ADMIN, **fields):
    return client.post("/v1/sweeps", json=sweep_spec(**fields), headers=auth(key))


def driver_token(backend, submission_id: str) -> dict[str, str]:
    env = next(env for sid, _, env in backend.submitted if sid == submission_id)
    return auth(env["ORCHESTRATOR_JOB_TOKEN"])


def test_a_submitted_sweep_is_queued_then_admitted_as_a_sweep_driver(app, client, backend):
    response = post_sweep(client, name="lr-search", max_concurrent_trials=2)
    assert response.status_code == 201, response.text
    sweep = response.json()
    assert (sweep["state"], sweep["total_trials"], sweep["best_trial"]) == ("QUEUED", 8, None)
    assert sweep["trials"] == {s: 0 for s in ("PENDING", "RUNNING", "SUCCEEDED", "STOPPED", "FAILED", "CANCELLED")}
    # The sweep holds 2 x 1.01 CPU of the fake's 4: a 2 x 1 CPU job submitted after it must wait.
    job = submit(client, ADMIN, scaling={"num_workers": 2, "cpus_per_worker": 1}).json()
    tick(app)
    sweep = client.get(f"/v1/sweeps/{sweep['id']}", headers=auth(ADMIN)).json()
    assert (sweep["state"], sweep["attempt"]) == ("STARTING", 1)
    submission, entrypoint, env = backend.submitted[0]
    assert submission == f"{sweep['id']}-1"
    assert entrypoint == f"python -m workers.sweep_driver --sweep-id {sweep['id']} --attempt 1"
    job = client.get(f"/v1/jobs/{job['id']}", headers=auth(ADMIN)).json()
    assert job["state"] == "QUEUED" and "needs 2 CPU, 1.98 free" in job["message"]
    assignment = client.get(
        f"/internal/v1/sweeps/{sweep['id']}/assignment", params={"attempt": 1}, headers=driver_token(backend, submission)
    )
    assert assignment.status_code == 200 and assignment.json()["spec"]["name"] == "lr-search"
    assert client.get(f"/internal/v1/sweeps/{sweep['id']}/assignment", params={"attempt": 1}, headers=auth("x")).status_code == 401


@pytest.mark.parametrize(
    ("fields", "loc"),
    [
        ({"search_space": {"lr.base": {"type": "loguniform", "low": 0, "high": 1}}}, "search_space"),
        ({"metric": "bleu"}, "metric"),
        ({"max_concurrent_trials": 5}, "max_concurrent_trials"),  # 5 x 1.01 CPU: never fits 4
        ({"base": {**BASE, "scaling": {"num_workers": 8}}}, "base"),
    ],
)
def test_bad_sweeps_answer_422_with_the_reason_and_store_nothing(client, fields, loc):
    response = post_sweep(client, **fields)
    assert response.status_code == 422, response.text
    assert loc in str(response.json()["detail"])
    assert client.get("/v1/sweeps", headers=auth(ADMIN)).json() == []


def test_trial_events_stream_into_the_trial_table_and_the_best_trial_stays_current(app, client, backend):
    sweep = post_sweep(client, metric="val_loss", scheduler={"type": "asha", "max_t": 4}).json()
    tick(app)
    headers = driver_token(backend, f"{sweep['id']}-1")

    def post(*events, attempt=1):
        return client.post(
            f"/internal/v1/sweeps/{sweep['id']}/events", json={"attempt": attempt, "events": list(events)}, headers=headers
        )

    def trial(tune_id, state, epoch=None, loss=None, **extra):
        event = {"type": "trial", "trial": tune_id, "state": state, "config": {"lr.base": 0.1 if tune_id == "a" else 0.01}}
        if epoch is not None:
            event |= {"epoch": epoch, "step": epoch * 10, "metrics": {"val_loss": loss, "val_accuracy": 1 - loss},
                      "checkpoint_path": f"/ckpt/{tune_id}/{epoch}"}
        return event | extra

    assert post({"type": "state", "state": "running"}).status_code == 200
    batch = [trial("a", "running"), trial("a", "running", 1, 0.5), trial("b", "running"), trial("b", "running", 1, 0.3),
             trial("a", "running", 2, 0.2), trial("b", "stopped", message="stopped by the scheduler after 1 of 4 epochs")]
    assert post(*batch).status_code == 200
    assert post(*batch).status_code == 200  # a retried batch changes nothing
    sweep = client.get(f"/v1/sweeps/{sweep['id']}", headers=auth(ADMIN)).json()
    trials = client.get(f"/v1/sweeps/{sweep['id']}/trials", headers=auth(ADMIN)).json()
    assert sweep["state"] == "RUNNING"
    assert [(t["tune_id"], t["number"], t["state"], t["iterations"], t["stopped_early"]) for t in trials] == [
        ("a", 1, "RUNNING", 2, False), ("b", 2, "STOPPED", 1, True),
    ]
    # Tune's ids end in the trial's index: that numbers them, whatever order their news arrives in.
    post(trial("x_00007", "running"), trial("x_00002", "running"))
    numbers = {t["tune_id"]: t["number"] for t in client.get(f"/v1/sweeps/{sweep['id']}/trials", headers=auth(ADMIN)).json()}
    assert (numbers["x_00002"], numbers["x_00007"]) == (3, 8)
    assert sweep["trials"]["RUNNING"] == 1 and sweep["trials"]["STOPPED"] == 1
    # val_loss is minimised: a's epoch 2 (0.2) beats b's epoch 1 (0.3).
    assert sweep["best_trial"] == {"id": trials[0]["id"], "config": {"lr.base": 0.1}, "metric": 0.2, "epoch": 2,
                                   "checkpoint_path": "/ckpt/a/2"}
    points = client.get(f"/v1/trials/{trials[0]['id']}/metrics", headers=auth(ADMIN)).json()
    assert [(p["epoch"], p["values"]["val_loss"]) for p in points] == [(1, 0.5), (2, 0.2)]
    # A late result of a finished trial is stored, its state is not reopened; a stale attempt is refused.
    assert post(trial("b", "running", 2, 0.1)).status_code == 200
    b = client.get(f"/v1/trials/{trials[1]['id']}", headers=auth(ADMIN)).json()
    assert b["state"] == "STOPPED" and b["best_metric"] == 0.1
    assert client.get(f"/v1/sweeps/{sweep['id']}", headers=auth(ADMIN)).json()["best_trial"]["id"] == b["id"]
    assert post(trial("c", "running"), attempt=2).status_code == 409
    # A trial that recorded every epoch (4) and is then reported stopped (a restored trial whose Train run had
    # finished: the driver saw no result) completed.
    post(*(trial("d", "running", epoch, 0.4) for epoch in range(1, 5)), trial("d", "stopped", message="after 0 of 4"))
    d = next(t for t in client.get(f"/v1/sweeps/{sweep['id']}/trials", headers=auth(ADMIN)).json() if t["tune_id"] == "d")
    assert (d["state"], d["stopped_early"], d["iterations"]) == ("SUCCEEDED", False, 4), d
    assert client.get("/v1/trials/nope/metrics", headers=auth(ADMIN)).status_code == 404
    # A running trial's best checkpoint may yet be replaced (and deleted by Ray Train): not deployable.
    deploy = client.post("/v1/deployments", json={"name": "from-a", "source": {"trial_id": trials[0]["id"]}},
                         headers=auth(ADMIN))
    assert deploy.status_code == 422 and "is RUNNING" in deploy.json()["detail"][0]["msg"], deploy.text


def test_cancel_ends_the_sweep_and_its_open_trials(app, client, backend):
    sweep = post_sweep(client).json()
    tick(app)
    headers = driver_token(backend, f"{sweep['id']}-1")
    events = [{"type": "state", "state": "running"},
              {"type": "trial", "trial": "a", "state": "running", "config": {"lr.base": 0.1}},
              {"type": "trial", "trial": "b", "state": "running", "config": {"lr.base": 0.2}},
              {"type": "trial", "trial": "b", "state": "succeeded"}]
    client.post(f"/internal/v1/sweeps/{sweep['id']}/events", json={"attempt": 1, "events": events}, headers=headers)
    response = client.post(f"/v1/sweeps/{sweep['id']}/cancel", headers=auth(ADMIN))
    assert response.json()["state"] == "CANCELLING" and backend.stopped == [f"{sweep['id']}-1"]
    reconcile(app)  # the fake's stop ends the run: STOPPED
    sweep = client.get(f"/v1/sweeps/{sweep['id']}", headers=auth(ADMIN)).json()
    assert sweep["state"] == "CANCELLED"
    states = {t["tune_id"]: (t["state"], t["reason"]) for t in client.get(f"/v1/sweeps/{sweep['id']}/trials", headers=auth(ADMIN)).json()}
    assert states == {"a": ("CANCELLED", "sweep_ended"), "b": ("SUCCEEDED", "completed")}
    assert client.post(f"/v1/sweeps/{sweep['id']}/cancel", headers=auth(ADMIN)).status_code == 409
    logs = client.get(f"/v1/sweeps/{sweep['id']}/logs", headers=auth(ADMIN))
    assert logs.status_code == 200 and logs.text == f"log of {sweep['id']}-1\n"  # the fake's driver output
    history = [(e["from_state"], e["to_state"]) for e in client.get(f"/v1/sweeps/{sweep['id']}/events", headers=auth(ADMIN)).json()]
    assert history == [(None, "QUEUED"), ("QUEUED", "STARTING"), ("STARTING", "RUNNING"), ("RUNNING", "CANCELLING"),
                       ("CANCELLING", "CANCELLED")]


def test_a_lost_sweep_driver_gets_a_new_attempt_with_a_new_token(app, client, backend):
    sweep = post_sweep(client, base={**BASE, "retries": {"max_attempts": 2}}).json()
    tick(app)
    old = driver_token(backend, f"{sweep['id']}-1")
    client.post(f"/internal/v1/sweeps/{sweep['id']}/events", json={"attempt": 1, "events": [{"type": "state", "state": "running"}]}, headers=old)
    backend.runs[f"{sweep['id']}-1"] = RunStatus.FAILED
    reconcile(app)
    sweep = client.get(f"/v1/sweeps/{sweep['id']}", headers=auth(ADMIN)).json()
    assert (sweep["state"], sweep["reason"], sweep["attempt"]) == ("RESTARTING", "driver_failed", 2)
    assert backend.submitted[-1][1].endswith("--attempt 2")
    assert client.get(f"/internal/v1/sweeps/{sweep['id']}/assignment", params={"attempt": 2}, headers=old).status_code == 401
    backend.runs[f"{sweep['id']}-2"] = RunStatus.FAILED
    reconcile(app)
    sweep = client.get(f"/v1/sweeps/{sweep['id']}", headers=auth(ADMIN)).json()
    assert (sweep["state"], sweep["reason"]) == ("FAILED", "driver_failed")


def test_sweeps_are_private_to_their_project(app, client):
    _, keys = make_project(client, "team-a")
    _, other = make_project(client, "team-b")
    sweep = post_sweep(client, key=keys["member"]).json()
    assert client.get(f"/v1/sweeps/{sweep['id']}", headers=auth(other["member"])).status_code == 404
    assert client.get("/v1/sweeps", headers=auth(other["member"])).json() == []
    assert [s["id"] for s in client.get("/v1/sweeps", headers=auth(keys["viewer"])).json()] == [sweep["id"]]
    assert post_sweep(client, key=keys["viewer"]).status_code == 403
    assert client.post(f"/v1/sweeps/{sweep['id']}/cancel", headers=auth(keys["member"])).json()["state"] == "CANCELLED"
