"""Hole 4: a run's token outlived the run, and a driver could record any path as its checkpoint, so job A's
driver could register project B's checkpoint folder for a member of A to deploy. Now a token stops working
when its run ends, a reported checkpoint must be a ``checkpoint_*`` folder of the run's own folder (links
followed), else the batch is refused (400, nothing applied), and an ended run's result is never rewritten."""

from __future__ import annotations

import os
from pathlib import Path

from orchestrator.db.models import Job, JobState
from orchestrator.services.job_events import apply_events
from orchestrator_contract.jobs import EventBatch
from tests.unit.api_helpers import ADMIN, auth, driver_exits, make_project, reconcile, run_token, submit, tick
from tests.unit.test_sweeps import driver_token, post_sweep


def started_job(app, client, backend, key: str = ADMIN) -> tuple[str, str]:
    job = submit(client, key).json()["id"]
    tick(app)
    return job, run_token(client, backend)


def post(client, job: str, token: str, *events: dict):
    return client.post(
        f"/internal/v1/jobs/{job}/events", json={"attempt": 1, "events": list(events)}, headers=auth(token)
    )


def checkpoint(path: Path | str, step: int = 10) -> dict:
    return {"type": "checkpoint", "epoch": 1, "step": step, "path": str(path), "size_bytes": 1, "metrics": {}}


def folder(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "model.pt").write_bytes(b"weights")
    return path


def test_a_jobs_token_stops_working_when_the_job_ends(app, client, backend):
    done, token = started_job(app, client, backend)
    assert post(client, done, token, {"type": "state", "state": "running"}).status_code == 200
    assert (
        post(client, done, token, {"type": "state", "state": "succeeded", "result": {"metrics": {"a": 1}}}).status_code
        == 200
    )
    driver_exits(app, backend)  # Ray confirms the reported end: the job ends
    rewrite = {"type": "state", "state": "succeeded", "result": {"metrics": {"a": 2}}}
    assert post(client, done, token, rewrite).status_code == 401
    assert client.get(f"/v1/jobs/{done}", headers=auth(ADMIN)).json()["result"] == {"metrics": {"a": 1}}

    cancelled, token = started_job(app, client, backend)
    client.post(f"/v1/jobs/{cancelled}/cancel", headers=auth(ADMIN))
    assert post(client, cancelled, token, {"type": "state", "state": "running"}).status_code == 200  # still stopping
    reconcile(app)
    assert client.get(f"/v1/jobs/{cancelled}", headers=auth(ADMIN)).json()["state"] == "CANCELLED"
    assert post(client, cancelled, token, {"type": "state", "state": "running"}).status_code == 401


def test_a_late_state_the_rules_refuse_does_not_rewrite_the_result(app, client, backend):
    job, _ = started_job(app, client, backend)
    client.post(f"/v1/jobs/{job}/cancel", headers=auth(ADMIN))
    reconcile(app)
    storage = app.state.service.storages.of(None)  # the default cluster's
    with app.state.service.sessions.begin() as session:  # below the endpoint: even with a valid token
        row = session.get(Job, job)
        assert row.state == JobState.CANCELLED
        batch = EventBatch.model_validate(
            {"attempt": 1, "events": [{"type": "state", "state": "succeeded", "result": {"x": 1}}]}
        )
        assert apply_events(session, row, batch, storage) == 0
        assert row.result is None


def test_a_driver_records_only_its_own_runs_checkpoints(app, client, backend):
    storage = Path(app.state.service.settings.storage_path)
    _, other_keys = make_project(client, "other")
    victim, _ = started_job(app, client, backend, key=other_keys["member"])
    theirs = folder(storage / victim / "checkpoint_000001")
    job, token = started_job(app, client, backend)
    mine = folder(storage / job / "checkpoint_000001")
    link = storage / job / "checkpoint_000002"
    os.symlink(theirs, link)  # inside my run folder by name, another project's folder in fact

    for path in (
        theirs,
        link,
        storage / job,
        storage / job / "checkpoint_000001" / ".." / ".." / victim / "checkpoint_000001",
        "/etc",
        f"{mine}/../../{victim}/checkpoint_000001",
    ):
        response = post(
            client,
            job,
            token,
            {"type": "metrics", "epoch": 1, "step": 5, "values": {"train_loss": 1.0}},
            checkpoint(path),
        )
        assert response.status_code == 400, (path, response.text)
        assert "is not a checkpoint_* folder of job" in response.json()["detail"]
    # Nothing of a refused batch was applied, not even its metric point.
    assert client.get(f"/v1/jobs/{job}/metrics", headers=auth(ADMIN)).json() == []
    assert client.get(f"/v1/jobs/{job}/checkpoints", headers=auth(ADMIN)).json() == []
    # A result naming a foreign checkpoint is refused too; the job's own is recorded.
    foreign_result = {"type": "state", "state": "succeeded", "result": {"checkpoint_path": str(theirs)}}
    assert post(client, job, token, foreign_result).status_code == 400
    assert post(client, job, token, checkpoint(mine)).status_code == 200
    assert [c["path"] for c in client.get(f"/v1/jobs/{job}/checkpoints", headers=auth(ADMIN)).json()] == [str(mine)]


def test_a_sweep_driver_records_only_each_trials_own_checkpoints_and_its_token_ends_with_the_sweep(
    app, client, backend
):
    sweep = post_sweep(client, search_space={"lr.base": {"type": "grid", "values": [0.1, 0.2]}}).json()
    tick(app)
    headers = driver_token(client, backend, f"{sweep['id']}-1")
    trials = Path(app.state.service.settings.storage_path) / sweep["id"] / "trials"
    own, others = folder(trials / "t_00000" / "checkpoint_000001"), folder(trials / "t_00001" / "checkpoint_000001")

    def report(tune_id: str, path: Path):
        event = {
            "type": "trial",
            "trial": tune_id,
            "state": "running",
            "config": {"lr.base": 0.1},
            "epoch": 1,
            "step": 10,
            "metrics": {"val_accuracy": 0.5},
            "checkpoint_path": str(path),
        }
        return client.post(
            f"/internal/v1/sweeps/{sweep['id']}/events", json={"attempt": 1, "events": [event]}, headers=headers
        )

    assert report("t_00000", others).status_code == 400  # another trial's run
    assert report("t_00000", Path("/etc") / "checkpoint_1").status_code == 400
    assert client.get(f"/v1/sweeps/{sweep['id']}/trials", headers=auth(ADMIN)).json() == []
    assert report("t_00000", own).status_code == 200
    done = {"type": "state", "state": "succeeded"}
    assert (
        client.post(
            f"/internal/v1/sweeps/{sweep['id']}/events", json={"attempt": 1, "events": [done]}, headers=headers
        ).status_code
        == 200
    )
    driver_exits(app, backend)  # Ray confirms the sweep's reported end: it ends, and its token with it
    assert report("t_00000", own).status_code == 401
