"""Sweeps on the real local Ray cluster: Ray Tune over distributed digits trials, through the API.

Every trial takes 0.9 CPU in its workers (2 x 0.45 where the test is about distributed trials: ASHA,
the driver kill; 1 x 0.9 where it is about the search, which saves a process start per trial); the
trial's own actor asks no CPU, so two trials take 1.8 of the cluster's 2 CPUs and a third one could not be
placed: a trial that did not release its workers would leave the sweep waiting.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import time
from datetime import datetime
from pathlib import Path

import httpx
import pytest
import torch

from tests.integration.conftest import project_key_headers, remove_serving
from tests.ray_state import state_api
from tests.trial_checkpoints import assert_trial_checkpoints_agree

pytestmark = pytest.mark.integration

TRIAL_SCALING = {"num_workers": 2, "cpus_per_worker": 0.45}
SEARCH_TRIAL_SCALING = {"num_workers": 1, "cpus_per_worker": 0.9}
# Two of these fill the 2 CPUs exactly: they run side by side only because a trial's own actor asks no CPU
# (it used to ask 0.01, and max_concurrent_trials 2 of them was refused at submit; docs/sweeps.md, "How it runs").
WHOLE_CPU_TRIAL = {"num_workers": 1, "cpus_per_worker": 1.0}
SWEEP_TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


def _base(**overrides) -> dict:
    return {"workload": "digits", "epochs": 1, "scaling": TRIAL_SCALING, "config": {"hidden": 32}, **overrides}


def _submit(api, **sweep) -> dict:
    response = api.http.post("/v1/sweeps", json=sweep)
    assert response.status_code == 201, response.text
    return response.json()


def _wait(api, sweep_id: str, timeout_s: float = 400, on_poll=None, expect: str = "SUCCEEDED") -> dict:
    """Poll until the sweep ends; ending other than ``expect`` fails the test with the reason."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        sweep = api.http.get(f"/v1/sweeps/{sweep_id}").json()
        if on_poll is not None:
            on_poll(sweep)
        if sweep["state"] in SWEEP_TERMINAL:
            assert sweep["state"] == expect, f"{sweep['state']} ({sweep['reason']}): {sweep['message'][-3000:]}"
            return sweep
        time.sleep(1)
    pytest.fail(f"sweep {sweep_id} did not finish in {timeout_s} s: {api.http.get(f'/v1/sweeps/{sweep_id}').json()}")


def _trials(api, sweep_id: str) -> list[dict]:
    response = api.http.get(f"/v1/sweeps/{sweep_id}/trials")
    response.raise_for_status()
    return response.json()


def _trials_dir(sweep: dict) -> Path:
    """``<storage>/<sweep>/trials``, from the best trial's checkpoint (``<trials>/<run>/checkpoint_*``)."""
    return Path(sweep["best_trial"]["checkpoint_path"]).parent.parent


def _most_at_once(trials: list[dict]) -> int:
    """The most trials running at one time, from the start and end the control plane recorded for each."""
    edges = sorted(
        [(datetime.fromisoformat(t["started_at"]), 1) for t in trials if t["started_at"]]
        + [(datetime.fromisoformat(t["finished_at"]), -1) for t in trials if t["finished_at"]]
    )
    running = most = 0
    for _, step in edges:  # an end and a start at the same instant: the end first
        running += step
        most = max(most, running)
    return most


def _deploy_and_check(api, cluster, name: str, trial: dict) -> dict:
    """Deploy the trial (its best checkpoint that exists) and wait until Serve runs it; removed afterwards."""
    response = api.http.post("/v1/deployments", json={"name": name, "source": {"trial_id": trial["id"]}})
    assert response.status_code == 201, response.text
    try:
        deployment = api.wait_deployment(name, {"HEALTHY"})
        assert deployment["current"]["checkpoint_path"] == trial["checkpoint_path"]
        return deployment
    finally:
        remove_serving(api, cluster, name)


def wait_cluster_idle(cluster, timeout_s: float = 90) -> None:
    """Until no live actor holds CPUs (Train workers, trial actors, Serve replicas of earlier tests) and no
    placement group reserves them (a cancelled trial's worker group is reserved until Ray removes its group, after
    its workers are gone): a test whose trials must run side by side needs the whole cluster. Fails naming what
    still holds CPUs."""
    deadline = time.monotonic() + timeout_s
    while True:
        holders = [
            f"{a.get('class_name')} {a.get('required_resources')}"
            for a in state_api(cluster.dashboard_url, cluster.token(), "actors", state="ALIVE")
            if (a.get("required_resources") or {}).get("CPU", 0) > 0
        ] + [
            f"placement group {g.get('placement_group_id')} {g.get('name')!r} {g.get('bundles')}"
            for g in state_api(cluster.dashboard_url, cluster.token(), "placement_groups", state="CREATED")
            if any((b.get("unit_resources") or {}).get("CPU", 0) > 0 for b in g.get("bundles") or [])
        ]
        if not holders:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"actors still hold CPUs {timeout_s:.0f} s on: {holders}")
        time.sleep(1)


def _alive_train_workers(cluster) -> int:
    return len(state_api(cluster.dashboard_url, cluster.token(), "actors", class_name="RayTrainWorker", state="ALIVE"))


def _wait_no_train_workers(cluster, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while (alive := _alive_train_workers(cluster)) and time.monotonic() < deadline:
        time.sleep(1)
    assert alive == 0, f"{alive} RayTrainWorker actors still alive {timeout_s} s after the sweep ended"


def _straggler_windows(settings, trial_ids: list[str]) -> dict[str, set[str]]:
    """Each trial's ranks with a count of slow epochs in a row, from the service's database."""
    from sqlalchemy import select

    from orchestrator.db.engine import make_engine, make_session_factory
    from orchestrator.db.models import Trial

    engine = make_engine(settings.database_url)
    try:
        with make_session_factory(engine)() as session:
            rows = session.scalars(select(Trial).where(Trial.id.in_(trial_ids)))
            return {row.id: set(row.straggler_windows or {}) for row in rows}
    finally:
        engine.dispose()


GOOD_LR, POOR_LR = [0.3, 0.2], [1e-5, 2e-5]


@pytest.fixture(scope="module")
def asha_sweep(admin) -> tuple[dict, list[dict]]:
    """An ASHA sweep over four learning rates, finished: (the sweep, its trials)."""
    # Grid order is submission order: two good learning rates first, then two that learn nearly nothing
    # in an epoch. One trial at a time, so a poor one reaches the first rung after the good ones recorded
    # theirs there (run side by side, a poor trial can get there first, and continue).
    sweep = _submit(
        admin,
        name="asha-digits",
        base=_base(epochs=4),
        search_space={"lr.base": {"type": "grid", "values": GOOD_LR + POOR_LR}},
        algorithm="grid",
        scheduler={"type": "asha", "max_t": 4, "grace_period": 1, "reduction_factor": 2},
        metric="val_accuracy",
        max_concurrent_trials=1,
    )
    assert sweep["state"] == "QUEUED" and sweep["total_trials"] == 4
    sweep = _wait(admin, sweep["id"])
    return sweep, _trials(admin, sweep["id"])


def test_asha_stops_the_poor_trials_early_and_frees_their_workers(admin, ray_cluster, asha_sweep, service_settings):
    sweep, trials = asha_sweep
    assert len(trials) == 4
    # Every epoch result carried each of the 2 ranks' own time per step (docs/jobs.md "Stragglers"), which the
    # control plane counted for each rank (whether one was slow is the machine's timing: not asserted).
    windows = _straggler_windows(service_settings, [t["id"] for t in trials])
    assert windows == {t["id"]: {"0", "1"} for t in trials}, windows
    by_lr = {t["config"]["lr.base"]: t for t in trials}
    for lr in POOR_LR:
        trial = by_lr[lr]
        assert trial["state"] == "STOPPED" and trial["stopped_early"], trial
        assert 1 <= trial["iterations"] < 4, trial
        assert len(admin.http.get(f"/v1/trials/{trial['id']}/metrics").json()) == trial["iterations"]
    finished = [t for t in trials if t["state"] == "SUCCEEDED"]
    assert finished and all(t["iterations"] == 4 and not t["stopped_early"] for t in finished)
    _wait_no_train_workers(ray_cluster)

    # The best trial is the trial table's best, with its metric history and the checkpoint of its best epoch.
    best = max((t for t in trials if t["best_metric"] is not None), key=lambda t: t["best_metric"])
    assert sweep["best_trial"]["id"] == best["id"]
    assert sweep["best_trial"]["metric"] == best["best_metric"] > 0.8
    assert best["config"]["lr.base"] in GOOD_LR and best["checkpoint_path"]
    points = admin.http.get(f"/v1/trials/{best['id']}/metrics").json()
    assert [p["epoch"] for p in points] == list(range(1, best["iterations"] + 1))
    assert max(p["values"]["val_accuracy"] for p in points) == best["best_metric"]
    counts = sweep["trials"]
    assert counts["STOPPED"] == len([t for t in trials if t["state"] == "STOPPED"]) >= 2
    assert counts["SUCCEEDED"] + counts["STOPPED"] == 4
    # Every checkpoint a trial names exists and verifies, and storage holds exactly those (stopped trials too).
    assert_trial_checkpoints_agree(admin.http, sweep["id"], _trials_dir(sweep))


def test_the_best_trial_deploys_to_ray_serve(admin, ray_cluster, asha_sweep):
    from sklearn.datasets import load_digits

    from orchestrator_contract.jobs import DigitsConfig
    from workers.train.checkpoints import load_model_from_checkpoint

    sweep, _ = asha_sweep
    best = sweep["best_trial"]
    # auth: project (the default): a key of the sweep's project, made before the deployment so that the
    # first Serve config already holds it (a key made later works from the serving reconciler's next pass).
    key = project_key_headers(admin, sweep["project_id"])
    response = admin.http.post("/v1/deployments", json={"name": "sweep-best", "source": {"trial_id": best["id"]}})
    assert response.status_code == 201, response.text
    try:
        deployment = admin.wait_deployment("sweep-best", {"HEALTHY"})
        assert deployment["current"]["checkpoint_path"] == best["checkpoint_path"]
        rows = load_digits(return_X_y=True)[0][:20].tolist()
        answer = httpx.post(deployment["url"], json={"inputs": rows}, headers=key, timeout=30).json()
        model = load_model_from_checkpoint(best["checkpoint_path"], "digits", DigitsConfig(hidden=32).model_dump())
        with torch.no_grad():
            expected = model(torch.tensor(rows, dtype=torch.float32)).argmax(dim=-1).tolist()
        assert answer["predictions"] == expected
    finally:
        remove_serving(admin, ray_cluster, "sweep-best")


def test_a_grid_sweep_runs_exactly_the_grid_two_trials_at_a_time(admin, ray_cluster):
    """Two 1-CPU trials at a time on the 2-CPU cluster (admission: docs/sweeps.md, "How it runs")."""
    space = {"config.hidden": [16, 32], "batch.per_worker": [32, 64]}
    wait_cluster_idle(ray_cluster)  # two whole-CPU trials side by side need the whole cluster
    sweep = _submit(
        admin,
        base=_base(scaling=WHOLE_CPU_TRIAL),
        search_space={path: {"type": "grid", "values": values} for path, values in space.items()},
        algorithm="grid",
        max_concurrent_trials=2,
    )
    assert sweep["total_trials"] == 4
    most_workers = 0

    def watch(_polled):
        nonlocal most_workers
        most_workers = max(most_workers, _alive_train_workers(ray_cluster))

    sweep = _wait(admin, sweep["id"], on_poll=watch)
    trials = _trials(admin, sweep["id"])
    # Never more than two trials (by the times recorded for each: a poll could miss an overlap), nor more
    # workers than two trials have (an upper bound, which a missed poll cannot break); none left at the end.
    assert _most_at_once(trials) == 2, [(t["started_at"], t["finished_at"]) for t in trials]
    assert 0 < most_workers <= 2 * WHOLE_CPU_TRIAL["num_workers"]
    _wait_no_train_workers(ray_cluster)
    configs = sorted(tuple(t["config"][p] for p in space) for t in trials)
    assert configs == sorted(itertools.product(*space.values()))


def test_a_trial_whose_epochs_tie_deploys_the_checkpoint_it_names(admin, ray_cluster):
    """The bug this guards: Ray Train kept the later of tied epochs and the trial named the earlier one,
    deleted, so deploying the trial failed. A rate of 1e-9 moves no prediction: every epoch's val_accuracy
    is the same, and with keep 1 only the latest and the best (by the tie rule, the same one) are kept."""
    sweep = _submit(
        admin,
        name="fifo-tie",
        base=_base(epochs=3, scaling=SEARCH_TRIAL_SCALING, checkpoint={"keep": 1}),
        search_space={"lr.base": {"type": "grid", "values": [1e-9]}},
        algorithm="grid",
    )
    sweep = _wait(admin, sweep["id"])
    (trial,) = _trials(admin, sweep["id"])
    points = admin.http.get(f"/v1/trials/{trial['id']}/metrics").json()
    assert len({p["values"]["val_accuracy"] for p in points}) == 1 and len(points) == 3, points  # a certain tie
    assert (trial["best_epoch"], sweep["best_trial"]["epoch"]) == (3, 3)
    assert [p["epoch"] for p in points if p["checkpoint_path"]] == [3]
    assert_trial_checkpoints_agree(admin.http, sweep["id"], _trials_dir(sweep))
    deployment = _deploy_and_check(admin, ray_cluster, "fifo-tie", trial)
    assert deployment["current"]["checkpoint"]["epoch"] == 3


def test_a_seeded_random_sweep_samples_the_same_configs_again_and_cancel_stops_every_trial(admin, ray_cluster):
    def submit(epochs: int) -> dict:
        return _submit(
            admin,
            base=_base(epochs=epochs, scaling=SEARCH_TRIAL_SCALING),
            search_space={
                "lr.base": {"type": "loguniform", "low": 0.01, "high": 0.3},
                "config.hidden": {"type": "choice", "values": [16, 24, 32, 48]},
            },
            algorithm="random",
            num_samples=2,
            seed=7,
            max_concurrent_trials=2,
        )

    def configs(sweep_id: str) -> list[tuple]:
        # In the order the search created them (trials are numbered so), whatever order they ran in.
        return [(t["config"]["lr.base"], t["config"]["config.hidden"]) for t in _trials(admin, sweep_id)]

    first = _wait(admin, submit(epochs=1)["id"])
    # The same seed again, as a long sweep this time, cancelled while both its trials train: both need the
    # whole cluster, so first wait until the first sweep's (and earlier tests') actors are gone.
    wait_cluster_idle(ray_cluster)
    again = submit(epochs=200)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        trials = _trials(admin, again["id"])
        if sum(1 for t in trials if t["state"] == "RUNNING" and t["iterations"] >= 1) == 2:
            break
        time.sleep(1)
    else:
        pytest.fail(f"two trials never ran: {_trials(admin, again['id'])}")
    assert configs(again["id"]) == configs(first["id"]) and len(set(configs(first["id"]))) == 2

    response = admin.http.post(f"/v1/sweeps/{again['id']}/cancel")
    assert response.status_code == 200 and response.json()["state"] == "CANCELLING"
    _wait(admin, again["id"], timeout_s=60, expect="CANCELLED")
    trials = _trials(admin, again["id"])
    assert len(trials) == 2 and all(t["state"] == "CANCELLED" for t in trials), trials
    _wait_no_train_workers(ray_cluster)
    assert admin.http.post(f"/v1/sweeps/{again['id']}/cancel").status_code == 409


def test_a_trial_past_its_own_deadline_checkpoints_stops_and_fails_deadline_exceeded(admin, ray_cluster):
    """``base.max_runtime_s``: the trial's rank 0 sees its id in the sweep's stop_trials, the loop checkpoints at its
    next step and stops, and the trial ends FAILED deadline_exceeded (its only trial: the sweep fails too)."""
    sweep = _submit(
        admin,
        base=_base(epochs=500, scaling=SEARCH_TRIAL_SCALING, max_runtime_s=15),
        search_space={"lr.base": {"type": "grid", "values": [0.1]}},
        algorithm="grid",
    )
    started = time.monotonic()
    sweep = _wait(admin, sweep["id"], timeout_s=240, expect="FAILED")
    (trial,) = _trials(admin, sweep["id"])
    assert (trial["state"], trial["reason"]) == ("FAILED", "deadline_exceeded"), trial["message"][-3000:]
    assert "ran past its max_runtime_s: checkpointed at step" in trial["message"], trial["message"][-2000:]
    assert 0 < trial["iterations"] < 500 and time.monotonic() - started < 200
    assert sweep["reason"] == "all_trials_failed"
    _wait_no_train_workers(ray_cluster)


def test_an_optuna_sweep_runs_tpe_over_the_space(admin, ray_cluster):
    wait_cluster_idle(ray_cluster)  # a sweep cancelled just before may still hold its trials' worker groups
    sweep = _submit(
        admin,
        base=_base(scaling=SEARCH_TRIAL_SCALING),
        search_space={"lr.base": {"type": "loguniform", "low": 0.01, "high": 0.3}},
        algorithm="optuna",
        num_samples=2,
        max_concurrent_trials=2,
        metric="val_loss",
    )
    assert sweep["mode"] == "min"
    sweep = _wait(admin, sweep["id"])
    trials = _trials(admin, sweep["id"])
    assert len(trials) == 2 and all(0.01 <= t["config"]["lr.base"] <= 0.3 for t in trials)
    assert sweep["best_trial"]["metric"] == min(t["best_metric"] for t in trials)


def _wait_for_committed_epoch(train_run: Path, epoch: int, timeout_s: float = 120) -> None:
    """Until Ray Train has registered the checkpoint of ``epoch`` in the run's snapshot."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            latest = json.loads((train_run / "checkpoint_manager_snapshot.json").read_text())[
                "latest_checkpoint_result"
            ]
            if latest and latest["metrics"].get("epoch") == epoch:
                return
        except (FileNotFoundError, json.JSONDecodeError):  # not written yet, or being rewritten
            pass
        time.sleep(0.02)
    pytest.fail(f"{train_run} never committed epoch {epoch}")


def test_a_killed_sweep_driver_resumes_without_rerunning_finished_trials(admin, ray_cluster):
    from ray.job_submission import JobSubmissionClient

    sweep = _submit(
        admin,
        base=_base(epochs=3),
        search_space={"lr.base": {"type": "grid", "values": [0.3, 0.2, 0.1]}},
        algorithm="grid",
        max_concurrent_trials=1,
    )
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        trials = _trials(admin, sweep["id"])
        if len(trials) == 2 and trials[0]["state"] == "SUCCEEDED" and trials[1]["iterations"] >= 1:
            break
        time.sleep(0.5)
    else:
        pytest.fail(f"the first trial never finished with the second under way: {_trials(admin, sweep['id'])}")
    first_points = admin.http.get(f"/v1/trials/{trials[0]['id']}/metrics").json()
    ray_jobs = JobSubmissionClient(
        ray_cluster.dashboard_url, headers={"Authorization": f"Bearer {ray_cluster.token()}"}
    )
    driver_pid = int(ray_jobs.get_job_info(f"{sweep['id']}-1").driver_info.pid)
    # The hardest moment: the second trial's Train run has just committed its last epoch, which the driver
    # has not passed on yet. Restored, that run is finished and trains no more; the epoch must still arrive.
    trials_folder = Path(trials[0]["checkpoint_path"]).parent.parent
    _wait_for_committed_epoch(trials_folder / trials[1]["tune_id"], epoch=3)
    os.kill(driver_pid, signal.SIGKILL)

    most_running = 0

    def watch(polled):
        nonlocal most_running
        most_running = max(most_running, polled["trials"]["RUNNING"])

    sweep = _wait(admin, sweep["id"], on_poll=watch)
    assert sweep["attempt"] == 2 and most_running == 1  # max_concurrent_trials holds across the restart
    history = [(e["to_state"], e["reason"]) for e in admin.http.get(f"/v1/sweeps/{sweep['id']}/events").json()]
    assert ("RESTARTING", "driver_failed") in history or ("RESTARTING", "driver_lost") in history, history
    after = _trials(admin, sweep["id"])
    # The same three trials (Tune restored them: no duplicate), each run to the end; the finished one not again.
    assert [t["tune_id"] for t in after[:2]] == [t["tune_id"] for t in trials] and len(after) == 3
    assert [(t["state"], t["iterations"]) for t in after] == [("SUCCEEDED", 3)] * 3, [
        (t["state"], t["iterations"], t["reason"], t["message"][-500:]) for t in after
    ]
    assert sorted(t["config"]["lr.base"] for t in after) == [0.1, 0.2, 0.3]
    assert admin.http.get(f"/v1/trials/{after[0]['id']}/metrics").json() == first_points
    assert after[0]["updated_at"] == trials[0]["updated_at"]
    # The restored trials' checkpoints: each named one exists and is its best kept epoch, storage holds
    # exactly the recorded ones, and every trial's last epoch is the one its Train run recorded.
    assert_trial_checkpoints_agree(admin.http, sweep["id"], trials_folder)
