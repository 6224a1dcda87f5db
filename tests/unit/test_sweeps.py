"""Sweeps without Ray: the spec's checks, its translation for Ray Tune, and the API, scheduler, reconciler
and sweep-driver endpoints over a fake cluster, on SQLite and PostgreSQL."""

from __future__ import annotations

import re

import pytest
from pydantic import ValidationError

from orchestrator.admission import ClusterCapacity, never_fits, shortfall, sweep_demand
from orchestrator.backend import RunStatus
from orchestrator_contract.sweeps import TRIAL_DRIVER_RESOURCES, SweepSpec, trial_spec
from tests.unit.api_helpers import ADMIN, auth, make_project, reconcile, run_token, submit, tick

BASE = {"workload": "digits", "epochs": 4, "scaling": {"num_workers": 2, "cpus_per_worker": 0.5}}
LR = {"lr.base": {"type": "loguniform", "low": 1e-3, "high": 0.3}}
HIDDEN = {"config.hidden": {"type": "choice", "values": [16, 32]}}
PBT = {"type": "pbt", "perturbation_interval": 1}


def sweep_spec(**fields) -> dict:
    return {"base": BASE, "search_space": LR, **fields}


# --- the spec ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        (
            {"search_space": {"lr.base": {"type": "uniform", "low": 0.3, "high": 0.1}}},
            "low (0.3) must be below high (0.1)",
        ),
        ({"search_space": {"lr.base": {"type": "loguniform", "low": 0, "high": 0.1}}}, "loguniform needs low > 0"),
        ({"search_space": {"optimizer.lr": {"type": "choice", "values": [1]}}}, "no field 'lr' in the base spec"),
        ({"search_space": {"config.depth": {"type": "choice", "values": [1]}}}, "no field 'depth'"),
        ({"search_space": {"workload": {"type": "choice", "values": ["tiny_gpt"]}}}, "workload is fixed for a sweep"),
        ({"search_space": {"config.hidden": {"type": "choice", "values": [64, 0]}}}, "value 0 makes an invalid job"),
        (
            {"search_space": {"optimizer.name": {"type": "grid", "values": ["sgd", "lamb"]}}},
            "value 'lamb' makes an invalid job",
        ),
        ({"search_space": {"batch.per_worker": {"type": "randint", "low": 8, "high": 8}}}, "randint needs low < high"),
        ({"metric": "accuracy"}, "mode is required for metric 'accuracy' (max or min)"),
        ({"metric": "val\tmae", "mode": "min"}, "(no spaces or control characters)"),
        (
            {"algorithm": "optuna", "search_space": {"lr.base": {"type": "grid", "values": [0.1, 0.2]}}},
            "cannot walk a grid",
        ),
        ({"algorithm": "grid"}, "algorithm grid needs every dimension of type grid"),
        ({"scheduler": {"type": "asha", "max_t": 2, "grace_period": 3}}, "grace_period (3) must be at most max_t (2)"),
        ({"scheduler": {"type": "asha", "max_t": 10}}, "scheduler.max_t (10) is more than base.epochs (4)"),
        ({"scheduler": {"type": "pbt"}}, "perturbation_interval\n  Field required"),
        (
            {"scheduler": PBT | {"perturbation_interval": 4}},
            "scheduler.perturbation_interval (4) must be below base.epochs (4)",
        ),
        ({"scheduler": PBT | {"quantile_fraction": 0.6}}, "quantile_fraction"),
        ({"scheduler": PBT, "algorithm": "optuna"}, "scheduler pbt: algorithm optuna cannot be used with it"),
        (
            {"scheduler": PBT, "search_space": {**LR, "epochs": {"type": "choice", "values": [3, 4]}}},
            "epochs cannot be searched",
        ),
        ({"scheduler": PBT, "search_space": HIDDEN}, "the search space has no lr.* path to mutate"),
        (
            {"scheduler": PBT | {"mutate": ["config.hidden"]}, "search_space": {**LR, **HIDDEN}},
            "scheduler.mutate['config.hidden']: only lr.* paths may be mutated",
        ),
        (
            {
                "scheduler": PBT | {"mutate": ["batch.per_worker"]},
                "search_space": {**LR, "batch.per_worker": {"type": "choice", "values": [16, 32]}},
            },
            "scheduler.mutate['batch.per_worker']: only lr.* paths may be mutated",
        ),
        (
            {"scheduler": PBT | {"mutate": ["lr.warmup_steps"]}},
            "scheduler.mutate['lr.warmup_steps']: not a search_space path",
        ),
        ({"scheduler": PBT, "base": {**BASE, "checkpoint": {"every_epochs": 2}}}, "a trial checkpoints every epoch"),
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
        "random",
        "fifo",
        "val_accuracy",
        "max",
        8,
    )
    assert SweepSpec.model_validate(sweep_spec(metric="val_loss")).mode == "min"
    # Any metric the workload's code reports, with its mode: the run's own (Workload.metrics).
    custom = {**BASE, "workload": "pkg.train:build", "config": {}}
    assert SweepSpec.model_validate(sweep_spec(base=custom, metric="val_mae", mode="min")).metric == "val_mae"
    grid = SweepSpec.model_validate(
        sweep_spec(
            algorithm="random",
            num_samples=2,
            search_space={
                "config.hidden": {"type": "grid", "values": [16, 32, 64]},
                "lr.base": {"type": "grid", "values": [0.1, 0.2]},
            },
        )
    )
    assert grid.total_trials == 12 and grid.concurrency == 2
    assert (
        SweepSpec.model_validate(sweep_spec(search_space={"lr.base": {"type": "grid", "values": [0.1]}})).num_samples
        == 1
    )
    scaled = SweepSpec.model_validate(
        sweep_spec(search_space={"scaling.num_workers": {"type": "choice", "values": [1, 3, 2]}})
    )
    assert scaled.worst_case_trial().scaling.num_workers == 3


def test_a_trial_spec_is_the_base_with_the_searched_paths_set():
    spec = SweepSpec.model_validate(sweep_spec())
    trial = trial_spec(spec.base, {"lr.base": 0.01, "config.hidden": 16, "batch.per_worker": 8})
    assert (trial.lr.base, trial.config["hidden"], trial.batch.per_worker) == (0.01, 16, 8)
    assert trial.epochs == spec.base.epochs and spec.base.config["hidden"] == 128  # the base is untouched


def test_the_search_space_in_ray_tune_terms():
    from ray.tune.search.sample import Categorical, Float, Integer

    from workers.tune.tuner import param_space

    spec = SweepSpec.model_validate(
        sweep_spec(
            search_space={
                "lr.base": {"type": "loguniform", "low": 1e-3, "high": 0.3},
                "lr.warmup_steps": {"type": "randint", "low": 0, "high": 10},
                "optimizer.momentum": {"type": "quniform", "low": 0.5, "high": 0.9, "q": 0.1},
                "config.hidden": {"type": "choice", "values": [16, 32]},
            }
        )
    )
    space = param_space(spec)
    assert isinstance(space["lr.base"], Float) and isinstance(space["lr.warmup_steps"], Integer)
    assert isinstance(space["config.hidden"], Categorical) and space["config.hidden"].categories == [16, 32]
    samples = [space["lr.base"].sample() for _ in range(200)]
    assert min(samples) >= 1e-3 and max(samples) <= 0.3
    assert all(0 <= space["lr.warmup_steps"].sample() < 10 for _ in range(50))


def test_a_pbt_sweep_mutates_its_learning_rate_paths_within_their_ranges():
    from ray.tune.schedulers import PopulationBasedTraining
    from ray.tune.search.sample import Float

    from workers.tune.tuner import PBT_TUNE_CHECKPOINTS, trial_scheduler, tune_checkpoint_config

    space = {**LR, **HIDDEN, "lr.warmup_steps": {"type": "choice", "values": [0, 5, 10]}}
    spec = SweepSpec.model_validate(sweep_spec(scheduler=PBT | {"perturbation_interval": 2}, search_space=space))
    # By default every lr.* path mutates; config.hidden only varies the first population.
    assert spec.scheduler.mutate == ["lr.base", "lr.warmup_steps"]
    assert (spec.scheduler.quantile_fraction, spec.scheduler.resample_probability) == (0.25, 0.25)
    scheduler = trial_scheduler(spec)
    assert isinstance(scheduler, PopulationBasedTraining)
    assert (scheduler._time_attr, scheduler._perturbation_interval) == ("epoch", 2)
    mutations = scheduler._hyperparam_mutations
    assert set(mutations) == {"lr.base", "lr.warmup_steps"}
    assert isinstance(mutations["lr.base"], Float) and mutations["lr.warmup_steps"] == [0, 5, 10]
    # x1.2 or x0.8 never leaves the range the spec checked.
    keep = scheduler._custom_explore_fn
    assert keep({"lr.base": 0.36, "lr.warmup_steps": 5}) == {"lr.base": 0.3, "lr.warmup_steps": 5}
    assert keep({"lr.base": 0.0008})["lr.base"] == 1e-3 and keep({"lr.base": 0.01})["lr.base"] == 0.01
    assert tune_checkpoint_config(spec).num_to_keep == PBT_TUNE_CHECKPOINTS > 2  # PBT warns at 2 or fewer
    assert tune_checkpoint_config(SweepSpec.model_validate(sweep_spec())) is None  # others make no Tune checkpoints
    # A grid for the first population is fine; explicit mutate paths are kept.
    grid = SweepSpec.model_validate(
        sweep_spec(
            algorithm="grid",
            search_space={"lr.base": {"type": "grid", "values": [0.01, 0.1]}},
            scheduler=PBT | {"mutate": ["lr.base"], "resample_probability": 0},
        )
    )
    assert trial_scheduler(grid)._hyperparam_mutations == {"lr.base": [0.01, 0.1]}


def test_a_trials_metrics_are_every_number_its_run_reported_not_tunes():
    from workers.tune.tuner import run_metrics

    # A Tune result as Ray 2.60 hands it to a callback: the run's report, the checkpoint path, Tune's keys.
    result = {
        "train_loss": 0.4,
        "val_loss": 0.5,
        "val_mae": 0.31,
        "eval/top-5:acc": 1,
        "samples_per_s": 900.0,
        "epoch": 3,
        "step": 12,
        "checkpoint_path": "/storage/s/trials/t/checkpoint_000002",
        "training_iteration": 3,
        "time_this_iter_s": 1.5,
        "time_total_s": 5.0,
        "timestamp": 1_700_000_000,
        "pid": 4242,
        "time_since_restore": 5.0,
        "iterations_since_restore": 3,
        "done": False,
        "trial_id": "t_00000",
        "date": "2026-11-25_17-00-00",
        "hostname": "node",
        "node_ip": "127.0.0.1",
        "config": {"lr.base": 0.1},
    }
    assert run_metrics(result) == {
        "train_loss": 0.4,
        "val_loss": 0.5,
        "val_mae": 0.31,
        "eval/top-5:acc": 1.0,
        "samples_per_s": 900.0,
    }


def test_pbt_leaves_a_trials_last_epoch_alone():
    from ray.tune.schedulers import TrialScheduler

    from workers.tune.tuner import trial_scheduler

    spec = SweepSpec.model_validate(sweep_spec(scheduler=PBT | {"perturbation_interval": 1}, search_space=LR))
    scheduler = trial_scheduler(spec)
    last = {"epoch": spec.base.epochs, spec.metric: 0.9}
    # No controller is needed to answer it: neither saved as a donor with no epoch left nor cloned into.
    assert scheduler.on_trial_result(None, object(), last) == TrialScheduler.CONTINUE
    assert not scheduler._trial_state
    # An earlier epoch goes on to Tune's PBT, which (never set up by a Tuner here) refuses it: its own error.
    earlier = {**last, "epoch": spec.base.epochs - 1}
    with pytest.raises(RuntimeError, match=re.escape(f"Cannot find metric None in trial result {earlier}")):
        scheduler.on_trial_result(None, object(), earlier)


def test_a_cloned_pbt_trial_starts_a_new_train_run(tmp_path):
    from workers.tune.tuner import _next_run_name

    for name in ("t_00001", "t_00001-1", "t_00001-3", "t_00001-x", "t_000011-7", "t_00002-9"):
        (tmp_path / name).mkdir()
    assert _next_run_name(str(tmp_path), "t_00001") == "t_00001-4"
    assert _next_run_name(str(tmp_path), "t_00003") == "t_00003-1"
    assert _next_run_name(str(tmp_path / "missing"), "t_00001") == "t_00001-1"


def test_a_sweep_reserves_its_concurrent_trials():
    spec = SweepSpec.model_validate(sweep_spec(max_concurrent_trials=3))
    demand = sweep_demand(spec)
    assert demand.total["CPU"] == pytest.approx(3 * (2 * 0.5))
    assert never_fits(demand, ClusterCapacity({"CPU": 2, "GPU": 0}, {"CPU": 2, "GPU": 0})) == (
        "needs 3 CPU for 3 concurrent trial(s) of 2 workers (lower max_concurrent_trials to fit) "
        "but the whole cluster has 2 CPU"
    )
    # Never more than the sweep's trials at once.
    one = SweepSpec.model_validate(sweep_spec(num_samples=1, max_concurrent_trials=3))
    assert sweep_demand(one).total["CPU"] == pytest.approx(1.0)


def test_two_one_cpu_trials_fit_two_cpus():
    """The trial's own actor asks no CPU (docs/sweeps.md, "How it runs"), so max_concurrent_trials 2 of 1-worker,
    1-CPU trials is admitted on a 2-CPU cluster (it needed 2.02 CPUs and was refused at submit)."""
    spec = SweepSpec.model_validate(
        sweep_spec(
            max_concurrent_trials=2, base={"workload": "digits", "scaling": {"num_workers": 1, "cpus_per_worker": 1}}
        )
    )
    demand = sweep_demand(spec)
    assert demand.total == {"CPU": 2.0, "GPU": 0.0}
    two_cpus = ClusterCapacity({"CPU": 2, "GPU": 0}, {"CPU": 2, "GPU": 0})
    assert never_fits(demand, two_cpus) is None
    assert shortfall(demand.total, {"CPU": 2.0, "GPU": 0.0}) is None
    assert TRIAL_DRIVER_RESOURCES["CPU"] == 0


# --- the API over a fake cluster ---------------------------------------------------------------------


def post_sweep(client, key=ADMIN, **fields):
    return client.post("/v1/sweeps", json=sweep_spec(**fields), headers=auth(key))


def driver_token(client, backend, submission_id: str) -> dict[str, str]:
    """The headers of the submission's driver: the run's token, claimed as the driver does at its start."""
    return auth(run_token(client, backend, submission_id))


def test_a_submitted_sweep_is_queued_then_admitted_as_a_sweep_driver(app, client, backend):
    response = post_sweep(client, name="lr-search", max_concurrent_trials=2)
    assert response.status_code == 201, response.text
    sweep = response.json()
    assert (sweep["state"], sweep["total_trials"], sweep["best_trial"]) == ("QUEUED", 8, None)
    assert sweep["trials"] == {s: 0 for s in ("PENDING", "RUNNING", "SUCCEEDED", "STOPPED", "FAILED", "CANCELLED")}
    # The sweep holds 2 x 1 CPU of the fake's 4 (its trials' own actors ask none): a 3 x 1 CPU job submitted
    # after it must wait.
    job = submit(client, ADMIN, scaling={"num_workers": 3, "cpus_per_worker": 1}).json()
    tick(app)
    sweep = client.get(f"/v1/sweeps/{sweep['id']}", headers=auth(ADMIN)).json()
    assert (sweep["state"], sweep["attempt"]) == ("STARTING", 1)
    submission, entrypoint, _env = backend.submitted[0]
    assert submission == f"{sweep['id']}-1"
    assert entrypoint == f"python -m workers.tune.driver --sweep-id {sweep['id']} --attempt 1"
    job = client.get(f"/v1/jobs/{job['id']}", headers=auth(ADMIN)).json()
    assert job["state"] == "QUEUED" and "needs 3 CPU, 2 free" in job["message"]
    assignment = client.get(
        f"/internal/v1/sweeps/{sweep['id']}/assignment",
        params={"attempt": 1},
        headers=driver_token(client, backend, submission),
    )
    assert assignment.status_code == 200 and assignment.json()["spec"]["name"] == "lr-search"
    assert (
        client.get(
            f"/internal/v1/sweeps/{sweep['id']}/assignment", params={"attempt": 1}, headers=auth("x")
        ).status_code
        == 401
    )


@pytest.mark.parametrize(
    ("fields", "loc"),
    [
        ({"search_space": {"lr.base": {"type": "loguniform", "low": 0, "high": 1}}}, "search_space"),
        ({"metric": "bleu"}, "mode is required for metric 'bleu'"),
        ({"metric": "bleu", "mode": "max"}, "workload 'digits' never reports 'bleu'"),
        ({"max_concurrent_trials": 5}, "max_concurrent_trials"),  # 5 x 1.01 CPU: never fits 4
        ({"base": {**BASE, "scaling": {"num_workers": 8}}}, "base"),
        ({"scheduler": PBT | {"mutate": ["config.hidden"]}, "search_space": {**LR, **HIDDEN}}, "only lr.* paths"),
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
    headers = driver_token(client, backend, f"{sweep['id']}-1")

    def post(*events, attempt=1):
        return client.post(
            f"/internal/v1/sweeps/{sweep['id']}/events",
            json={"attempt": attempt, "events": list(events)},
            headers=headers,
        )

    trials_dir = f"{app.state.service.settings.storage_path}/{sweep['id']}/trials"

    def trial(tune_id, state, epoch=None, loss=None, **extra):
        event = {
            "type": "trial",
            "trial": tune_id,
            "state": state,
            "config": {"lr.base": 0.1 if tune_id == "a" else 0.01},
        }
        if epoch is not None:
            event |= {
                "epoch": epoch,
                "step": epoch * 10,
                "metrics": {"val_loss": loss, "val_accuracy": 1 - loss},
                "checkpoint_path": f"{trials_dir}/{tune_id}/checkpoint_{epoch}",
            }
        return event | extra

    assert post({"type": "state", "state": "running"}).status_code == 200
    batch = [
        trial("a", "running"),
        trial("a", "running", 1, 0.5),
        trial("b", "running"),
        trial("b", "running", 1, 0.3),
        trial("a", "running", 2, 0.2),
        trial("b", "stopped", message="stopped by the scheduler after 1 of 4 epochs"),
    ]
    assert post(*batch).status_code == 200
    assert post(*batch).status_code == 200  # a retried batch changes nothing
    sweep = client.get(f"/v1/sweeps/{sweep['id']}", headers=auth(ADMIN)).json()
    trials = client.get(f"/v1/sweeps/{sweep['id']}/trials", headers=auth(ADMIN)).json()
    assert sweep["state"] == "RUNNING"
    assert [(t["tune_id"], t["number"], t["state"], t["iterations"], t["stopped_early"]) for t in trials] == [
        ("a", 1, "RUNNING", 2, False),
        ("b", 2, "STOPPED", 1, True),
    ]
    # Tune's ids end in the trial's index: that numbers them, whatever order their news arrives in.
    post(trial("x_00007", "running"), trial("x_00002", "running"))
    numbers = {
        t["tune_id"]: t["number"] for t in client.get(f"/v1/sweeps/{sweep['id']}/trials", headers=auth(ADMIN)).json()
    }
    assert (numbers["x_00002"], numbers["x_00007"]) == (3, 8)
    assert sweep["trials"]["RUNNING"] == 1 and sweep["trials"]["STOPPED"] == 1
    # val_loss is minimised: a's epoch 2 (0.2) beats b's epoch 1 (0.3).
    assert sweep["best_trial"] == {
        "id": trials[0]["id"],
        "config": {"lr.base": 0.1},
        "metric": 0.2,
        "epoch": 2,
        "checkpoint_path": f"{trials_dir}/a/checkpoint_2",
    }
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
    d = next(
        t for t in client.get(f"/v1/sweeps/{sweep['id']}/trials", headers=auth(ADMIN)).json() if t["tune_id"] == "d"
    )
    assert (d["state"], d["stopped_early"], d["iterations"]) == ("SUCCEEDED", False, 4), d
    # Every trial has a history like a job's: its creation, then each transition with its reason.
    history = client.get(f"/v1/trials/{b['id']}/events", headers=auth(ADMIN)).json()
    assert [(e["from_state"], e["to_state"]) for e in history] == [
        (None, "PENDING"),
        ("PENDING", "RUNNING"),
        ("RUNNING", "STOPPED"),
    ], history
    assert history[-1]["message"] == "stopped by the scheduler after 1 of 4 epochs"
    assert client.get("/v1/trials/nope/events", headers=auth(ADMIN)).status_code == 404
    assert client.get("/v1/trials/nope/metrics", headers=auth(ADMIN)).status_code == 404
    # A running trial's best checkpoint may yet be replaced (and deleted by Ray Train): not deployable.
    deploy = client.post(
        "/v1/deployments", json={"name": "from-a", "source": {"trial_id": trials[0]["id"]}}, headers=auth(ADMIN)
    )
    assert deploy.status_code == 422 and "is RUNNING" in deploy.json()["detail"][0]["msg"], deploy.text


def test_a_pbt_exploit_changes_the_trials_config_and_its_history_goes_on(app, client, backend):
    sweep = post_sweep(client, scheduler=PBT).json()
    assert sweep["spec"]["scheduler"]["mutate"] == ["lr.base"]  # the default, filled in
    tick(app)
    headers = driver_token(client, backend, f"{sweep['id']}-1")

    def trial(lr, epoch=None, accuracy=None):
        event = {"type": "trial", "trial": "p_00000", "state": "running", "config": {"lr.base": lr}}
        if epoch is not None:
            event |= {"epoch": epoch, "step": epoch * 10, "metrics": {"val_accuracy": accuracy}}
        return event

    # Epochs 1-2 at a poor rate; then PBT clones a better trial's epoch-2 checkpoint with its rate x1.2.
    events = [trial(1e-5), trial(1e-5, 1, 0.1), trial(1e-5, 2, 0.12), trial(0.36), trial(0.36, 3, 0.9)]
    response = client.post(
        f"/internal/v1/sweeps/{sweep['id']}/events", json={"attempt": 1, "events": events}, headers=headers
    )
    assert response.status_code == 200, response.text
    (stored,) = client.get(f"/v1/sweeps/{sweep['id']}/trials", headers=auth(ADMIN)).json()
    assert (stored["config"], stored["iterations"], stored["best_metric"]) == ({"lr.base": 0.36}, 3, 0.9)
    points = client.get(f"/v1/trials/{stored['id']}/metrics", headers=auth(ADMIN)).json()
    assert [(p["epoch"], p["values"]["val_accuracy"]) for p in points] == [(1, 0.1), (2, 0.12), (3, 0.9)]


def started_with_two_trials(app, client, backend) -> tuple[dict, dict, list[dict]]:
    """A sweep whose driver runs; its token's headers and the events that start trials a and b."""
    sweep = post_sweep(client).json()
    tick(app)
    events = [
        {"type": "state", "state": "running"},
        {"type": "trial", "trial": "a", "state": "running", "config": {"lr.base": 0.1}},
        {"type": "trial", "trial": "b", "state": "running", "config": {"lr.base": 0.2}},
    ]
    return sweep, driver_token(client, backend, f"{sweep['id']}-1"), events


def test_cancel_ends_the_sweep_and_its_open_trials(app, client, backend):
    sweep, headers, events = started_with_two_trials(app, client, backend)
    events.append({"type": "trial", "trial": "b", "state": "succeeded"})
    client.post(f"/internal/v1/sweeps/{sweep['id']}/events", json={"attempt": 1, "events": events}, headers=headers)
    response = client.post(f"/v1/sweeps/{sweep['id']}/cancel", headers=auth(ADMIN))
    assert response.json()["state"] == "CANCELLING" and backend.stopped == [f"{sweep['id']}-1"]
    reconcile(app)  # the fake's stop ends the run: STOPPED
    sweep = client.get(f"/v1/sweeps/{sweep['id']}", headers=auth(ADMIN)).json()
    assert sweep["state"] == "CANCELLED"
    states = {
        t["tune_id"]: (t["state"], t["reason"])
        for t in client.get(f"/v1/sweeps/{sweep['id']}/trials", headers=auth(ADMIN)).json()
    }
    assert states == {"a": ("CANCELLED", "sweep_ended"), "b": ("SUCCEEDED", "completed")}
    assert client.post(f"/v1/sweeps/{sweep['id']}/cancel", headers=auth(ADMIN)).status_code == 409
    logs = client.get(f"/v1/sweeps/{sweep['id']}/logs", headers=auth(ADMIN))
    assert logs.status_code == 200 and logs.text == f"log of {sweep['id']}-1\n"  # the fake's driver output
    history = [
        (e["from_state"], e["to_state"])
        for e in client.get(f"/v1/sweeps/{sweep['id']}/events", headers=auth(ADMIN)).json()
    ]
    assert history == [
        (None, "QUEUED"),
        ("QUEUED", "STARTING"),
        ("STARTING", "RUNNING"),
        ("RUNNING", "CANCELLING"),
        ("CANCELLING", "CANCELLED"),
    ]


def test_a_lost_sweep_driver_gets_a_new_attempt_with_a_new_token(app, client, backend):
    sweep = post_sweep(client, base={**BASE, "retries": {"max_attempts": 2}}).json()
    tick(app)
    old = driver_token(client, backend, f"{sweep['id']}-1")
    client.post(
        f"/internal/v1/sweeps/{sweep['id']}/events",
        json={"attempt": 1, "events": [{"type": "state", "state": "running"}]},
        headers=old,
    )
    backend.runs[f"{sweep['id']}-1"] = RunStatus.FAILED
    reconcile(app)
    sweep = client.get(f"/v1/sweeps/{sweep['id']}", headers=auth(ADMIN)).json()
    assert (sweep["state"], sweep["reason"], sweep["attempt"]) == ("RESTARTING", "driver_failed", 2)
    assert backend.submitted[-1][1].endswith("--attempt 2")
    assert (
        client.get(f"/internal/v1/sweeps/{sweep['id']}/assignment", params={"attempt": 2}, headers=old).status_code
        == 401
    )
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


def test_a_failed_trial_keeps_the_reason_its_driver_classified(app, client, backend):
    sweep, headers, events = started_with_two_trials(app, client, backend)
    events += [
        {"type": "trial", "trial": "a", "state": "failed", "reason": "code_error", "message": "Traceback ..."},
        {"type": "trial", "trial": "b", "state": "failed", "message": "TuneError: ..."},
    ]
    response = client.post(
        f"/internal/v1/sweeps/{sweep['id']}/events", json={"attempt": 1, "events": events}, headers=headers
    )
    assert response.status_code == 200, response.text
    trials = client.get(f"/v1/sweeps/{sweep['id']}/trials", headers=auth(ADMIN)).json()
    assert {t["tune_id"]: (t["state"], t["reason"]) for t in trials} == {
        "a": ("FAILED", "code_error"),
        "b": ("FAILED", "trial_error"),  # an error that is not a Train run's: the default
    }
