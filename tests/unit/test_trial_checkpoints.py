"""A checkpoint the control plane names is a folder that exists: sweep trials' retention (the jobs' rule,
ties to the newer), the sweeper, and deploying a trial's or a job's best checkpoint when some are gone.
Over the unit-test app (a fake cluster), real storage folders, SQLite and PostgreSQL."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.checkpoint_policy import RecordedCheckpoint, best_first, select_kept, trial_retention
from orchestrator_contract.jobs import KeepBestSpec
from orchestrator_contract.sweeps import SweepSpec
from tests.unit.api_helpers import ADMIN, auth, tick
from tests.unit.test_deployments import finished_job
from tests.unit.test_sweeps import BASE, driver_token, post_sweep

TIE = 0.9  # every epoch scores the same: ties are certain


@pytest.fixture
def settings_overrides() -> dict:
    return {"serve_port": 8123, "workload_packages": ""}


# --- the rule -------------------------------------------------------------------------------------------------


def recorded(*accuracies: float) -> list[RecordedCheckpoint]:
    return [
        RecordedCheckpoint(i, f"/s/checkpoint_{i}", 10 * i, {"val_accuracy": a}) for i, a in enumerate(accuracies, 1)
    ]


def test_ties_go_to_the_newer_checkpoint_in_retention_and_in_best():
    checkpoints = recorded(TIE, TIE, TIE, TIE)
    ranked = best_first(checkpoints, "val_accuracy", "max", metrics=lambda c: c.metrics, order=lambda c: c.id)
    assert [c.id for c in ranked] == [4, 3, 2, 1]
    assert select_kept(checkpoints, 1, KeepBestSpec(metric="val_accuracy", count=2)) == {4, 3}
    # min mode: the newer of the lowest wins too.
    losses = [RecordedCheckpoint(i, "", 0, {"val_loss": v}) for i, v in enumerate((0.2, 0.1, 0.1, 0.3), 1)]
    assert [c.id for c in best_first(losses, "val_loss", "min", metrics=lambda c: c.metrics, order=lambda c: c.id)] == [
        3,
        2,
        1,
        4,
    ]


def test_a_trial_keeps_its_latest_and_the_best_base_keep_by_the_sweeps_metric():
    spec = SweepSpec.model_validate(
        {
            "base": {**BASE, "checkpoint": {"keep": 3}},
            "metric": "val_loss",
            "search_space": {"lr.base": {"type": "grid", "values": [0.1]}},
        }
    )
    keep, keep_best = trial_retention(spec)
    assert (keep, keep_best.metric, keep_best.mode, keep_best.count) == (1, "val_loss", "min", 3)


# --- a sweep over the API ---------------------------------------------------------------------------------------


class Sweep:
    """A one-trial grid sweep admitted on the fake cluster, whose driver reports through the real endpoint
    and whose trial's checkpoint folders are real folders in the app's storage."""

    def __init__(self, app, client, backend, **fields):
        self.app, self.client = app, client
        body = post_sweep(client, search_space={"lr.base": {"type": "grid", "values": [0.1]}}, **fields)
        assert body.status_code == 201, body.text
        self.id = body.json()["id"]
        tick(app)
        self.headers = driver_token(client, backend, f"{self.id}-1")
        self.run = Path(app.state.service.settings.storage_path) / self.id / "trials" / "t_00000"
        self.post({"type": "state", "state": "running"})

    def folder(self, epoch: int, run: Path | None = None) -> Path:
        folder = (run or self.run) / f"checkpoint_{epoch:06d}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "model.pt").write_bytes(b"weights")
        return folder

    def epoch(self, epoch: int, accuracy: float, run: Path | None = None, state: str = "running") -> Path:
        folder = self.folder(epoch, run)
        self.post(
            {
                "type": "trial",
                "trial": "t_00000",
                "state": state,
                "config": {"lr.base": 0.1},
                "epoch": epoch,
                "step": 10 * epoch,
                "metrics": {"val_accuracy": accuracy, "val_loss": 1 - accuracy},
                "checkpoint_path": str(folder),
            }
        )
        return folder

    def post(self, *events) -> None:
        response = self.client.post(
            f"/internal/v1/sweeps/{self.id}/events", json={"attempt": 1, "events": list(events)}, headers=self.headers
        )
        assert response.status_code == 200, response.text

    def end_trial(self) -> None:
        self.post(
            {"type": "trial", "trial": "t_00000", "state": "succeeded", "config": {"lr.base": 0.1}},
            {"type": "state", "state": "succeeded"},
        )

    def trial(self) -> dict:
        (trial,) = self.client.get(f"/v1/sweeps/{self.id}/trials", headers=auth(ADMIN)).json()
        return trial

    def sweeper(self, finished: bool = True):
        return self.app.state.service.checkpoints.trials.sweep(self.id, finished)


def test_a_trial_whose_epochs_tie_names_a_checkpoint_that_exists_and_deploys(app, client, backend):
    sweep = Sweep(app, client, backend)  # base.checkpoint.keep = 2: the latest + the best 2
    folders = [sweep.epoch(epoch, TIE) for epoch in range(1, 5)]
    assert [f.exists() for f in folders] == [False, False, True, True]
    trial = sweep.trial()
    # Ties go to the later epoch, as retention (and Ray Train) break them: epoch 4, whose folder is kept.
    assert (trial["best_epoch"], trial["best_metric"], trial["checkpoint_path"]) == (4, TIE, str(folders[3]))
    points = client.get(f"/v1/trials/{trial['id']}/metrics", headers=auth(ADMIN)).json()
    assert [p["epoch"] for p in points] == [1, 2, 3, 4]  # the metric history stays whole
    sweep.end_trial()
    best = client.get(f"/v1/sweeps/{sweep.id}", headers=auth(ADMIN)).json()["best_trial"]
    assert (best["id"], best["checkpoint_path"]) == (trial["id"], str(folders[3]))
    response = client.post(
        "/v1/deployments", json={"name": "best", "source": {"trial_id": trial["id"]}}, headers=auth(ADMIN)
    )
    assert response.status_code == 201, response.text
    assert response.json()["target"]["checkpoint"]["epoch"] == 4


def test_a_better_epoch_survives_retention_and_stays_the_trials_best(app, client, backend):
    sweep = Sweep(app, client, backend)
    folders = [sweep.epoch(epoch, accuracy) for epoch, accuracy in enumerate((0.5, 0.95, 0.6, 0.7, 0.8), 1)]
    # The latest (5) and the best two by val_accuracy (2: 0.95, 5: 0.8); 4 (0.7) goes once 5 beats it.
    assert [f.exists() for f in folders] == [False, True, False, False, True]
    trial = sweep.trial()
    assert (trial["best_epoch"], trial["checkpoint_path"]) == (2, str(folders[1]))


def test_a_checkpoint_gone_from_storage_is_forgotten_and_the_next_best_is_deployed(app, client, backend):
    sweep = Sweep(app, client, backend, base={**BASE, "checkpoint": {"keep": 3}})  # all three are kept
    folders = [sweep.epoch(epoch, accuracy) for epoch, accuracy in enumerate((0.5, 0.95, 0.6), 1)]
    sweep.end_trial()
    trial_id = sweep.trial()["id"]
    for folder in (folders[1], folders[2]):
        (folder / "model.pt").unlink()
        folder.rmdir()
    orphan = sweep.folder(7)  # a save no epoch recorded (say, the epoch ASHA stopped the trial in)
    # Before the sweeper has run, a deployment passes over the vanished best and takes the next that exists.
    response = client.post(
        "/v1/deployments", json={"name": "next", "source": {"trial_id": trial_id}}, headers=auth(ADMIN)
    )
    assert response.status_code == 201, response.text
    assert response.json()["target"]["checkpoint"]["epoch"] == 1
    deleted, forgotten = sweep.sweeper()
    assert sorted(forgotten) == [str(folders[1]), str(folders[2])] and deleted == [str(orphan)] and not orphan.exists()
    trial = sweep.trial()
    assert (trial["best_epoch"], trial["checkpoint_path"]) == (1, str(folders[0]))
    assert client.get(f"/v1/sweeps/{sweep.id}", headers=auth(ADMIN)).json()["best_trial"]["checkpoint_path"] == str(
        folders[0]
    )


def test_a_trial_with_no_checkpoint_left_is_422_and_a_served_one_is_never_deleted(app, client, backend):
    sweep = Sweep(app, client, backend)
    first = sweep.epoch(1, 0.95)
    sweep.end_trial()
    trial_id = sweep.trial()["id"]
    assert (
        client.post(
            "/v1/deployments", json={"name": "a", "source": {"trial_id": trial_id}}, headers=auth(ADMIN)
        ).status_code
        == 201
    )
    # The deployment references epoch 1's folder: retention keeps it even once it is neither latest nor best.
    app.state.service.checkpoints.trials.enforce_retention(trial_id)
    assert first.exists()
    (first / "model.pt").unlink()
    first.rmdir()
    sweep.sweeper()
    response = client.post("/v1/deployments", json={"name": "b", "source": {"trial_id": trial_id}}, headers=auth(ADMIN))
    assert response.status_code == 422
    assert "has no checkpoint left to deploy" in response.json()["detail"][0]["msg"]


def test_a_pbt_trials_checkpoints_in_its_later_runs_are_kept_by_the_same_rule(app, client, backend):
    sweep = Sweep(app, client, backend, scheduler={"type": "pbt", "perturbation_interval": 1})
    clone = sweep.run.with_name("t_00000-1")  # PBT cloned another trial into this one: a new Train run
    folders = [sweep.epoch(1, TIE), sweep.epoch(2, TIE), sweep.epoch(3, TIE, run=clone), sweep.epoch(4, TIE, run=clone)]
    assert [f.exists() for f in folders] == [False, False, True, True]
    assert sweep.trial()["checkpoint_path"] == str(folders[3])
    # A folder of another trial's run can't be recorded as this one's (400, nothing applied), so this trial's
    # retention never deletes it.
    stranger = sweep.folder(5, run=sweep.run.with_name("t_00001"))
    refused = sweep.client.post(
        f"/internal/v1/sweeps/{sweep.id}/events",
        headers=sweep.headers,
        json={
            "attempt": 1,
            "events": [
                {
                    "type": "trial",
                    "trial": "t_00000",
                    "state": "running",
                    "config": {"lr.base": 0.1},
                    "epoch": 5,
                    "step": 50,
                    "metrics": {"val_accuracy": 0.1},
                    "checkpoint_path": str(stranger),
                }
            ],
        },
    )
    assert refused.status_code == 400 and "is not a checkpoint_* folder of trial t_00000's runs" in refused.text
    assert stranger.exists() and sweep.trial()["iterations"] == 4


# --- jobs: the same rule -----------------------------------------------------------------------------------------


def test_a_jobs_best_on_a_tie_is_the_newer_and_a_vanished_best_falls_back(app, client, tmp_path):
    job_id, checkpoints = finished_job(app, tmp_path, accuracies=(0.8, TIE, TIE, 0.7))
    with app.state.service.sessions() as session:
        from orchestrator.db.models import Checkpoint

        rows = [session.get(Checkpoint, i) for i in checkpoints]
        as_recorded = [RecordedCheckpoint(r.id, r.path, r.step, dict(r.metrics)) for r in rows]
    # keep_best count 1 keeps the newer of the tie (epoch 3), and "best" deploys that very one.
    assert checkpoints[2] in select_kept(as_recorded, 1, KeepBestSpec(metric="val_accuracy", count=1))
    body = client.post(
        "/v1/deployments", json={"name": "tie", "source": {"job_id": job_id}}, headers=auth(ADMIN)
    ).json()
    assert body["target"]["checkpoint_id"] == checkpoints[2]
    # The best folder vanished (no sweeper pass yet): the next best that exists, not a 422.
    best = Path(rows[2].path)
    (best / "model.pt").unlink()
    best.rmdir()
    body = client.post(
        "/v1/deployments", json={"name": "next", "source": {"job_id": job_id}}, headers=auth(ADMIN)
    ).json()
    assert body["target"]["checkpoint_id"] == checkpoints[1]
