"""Usage accounting (docs/usage.md): the ledger the state engine writes, read back by ``GET /v1/usage`` on SQLite and
PostgreSQL, against runs whose transitions happen at known instants (the engine's clock is moved by hand)."""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from api.app import create_app
from orchestrator.db.models import (
    Checkpoint,
    DeploymentState,
    JobState,
    TrialMetric,
    TrialState,
    UsageInterval,
    utcnow,
)
from orchestrator.repositories import deployments as deployments_repo
from orchestrator.repositories import sweeps as sweeps_repo
from orchestrator.settings import Settings
from orchestrator.states import core
from orchestrator.states.deployments import lock_deployment, record_deployment_created, set_deployment_state
from orchestrator.states.jobs import lock_job, set_job_state
from orchestrator.states.sweeps import lock_sweep, set_sweep_state, set_trial_state
from orchestrator_contract.rest.usage import CSV_COLUMNS, UsageReport
from orchestrator_contract.sweeps import SweepSpec
from tests.fakes import FakeBackend
from tests.unit.api_helpers import ADMIN, auth, make_project, submit

S = JobState
T0 = datetime(2026, 1, 2, tzinfo=UTC)  # a midnight


class Clock:
    def __init__(self):
        self.now = T0

    def at(self, seconds: float) -> datetime:
        self.now = T0 + timedelta(seconds=seconds)
        return self.now


@pytest.fixture
def clock(monkeypatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(core, "utcnow", lambda: clock.now)
    return clock


def iso(seconds: float) -> str:
    return (T0 + timedelta(seconds=seconds)).isoformat()


def move(app, clock, job_id, seconds, state, reason="x", **kwargs):
    clock.at(seconds)
    with app.state.service.sessions.begin() as session:
        assert set_job_state(session, lock_job(session, job_id), state, reason, **kwargs)


def checkpoint(app, job_id, seconds, step):
    with app.state.service.sessions.begin() as session:
        session.add(
            Checkpoint(
                job_id=job_id,
                attempt=1,
                epoch=0,
                step=step,
                path=f"/ckpt/{job_id}/{step}",
                metrics={},
                created_at=T0 + timedelta(seconds=seconds),
            )
        )


def new_job(client, key, labels=None, **scaling) -> str:
    response = submit(client, key, scaling=scaling, labels=labels or {})
    assert response.status_code == 201, response.text
    return response.json()["id"]


@pytest.fixture
def world(app, client, clock):
    """Two projects and their runs at known instants (seconds after T0):

    vision/a  2 workers x 1 CPU (4 GB each): RUNNING 10-100 (checkpoint at 70, then a worker dies: 30 s
              wasted), RUNNING again 120-300, SUCCEEDED.                      team=vision
    vision/b  1 worker x 2 CPUs: RUNNING 60-160, FAILED with no checkpoint (all 100 s wasted).  team=nlp
    nlp/d     1 worker x 1 CPU: RUNNING -100 (the day before) to 100, SUCCEEDED.  unlabelled
    """
    vision, vision_keys = make_project(client, "vision")
    nlp, nlp_keys = make_project(client, "nlp")
    a = new_job(client, vision_keys["member"], {"team": "vision"}, num_workers=2, cpus_per_worker=1)
    b = new_job(client, vision_keys["member"], {"team": "nlp"}, num_workers=1, cpus_per_worker=2)
    d = new_job(client, nlp_keys["member"], num_workers=1, cpus_per_worker=1)
    move(app, clock, d, -110, S.STARTING)
    move(app, clock, d, -100, S.RUNNING)
    move(app, clock, a, 0, S.STARTING)
    move(app, clock, a, 10, S.RUNNING)
    move(app, clock, b, 50, S.STARTING)
    move(app, clock, b, 60, S.RUNNING)
    checkpoint(app, a, 70, 7)
    move(app, clock, a, 100, S.RESTARTING, "worker_died")
    move(app, clock, d, 100, S.SUCCEEDED)
    move(app, clock, a, 120, S.RUNNING)
    move(app, clock, b, 160, S.FAILED, "app_error")
    move(app, clock, a, 300, S.SUCCEEDED)
    return {"vision": vision, "nlp": nlp, "vision_keys": vision_keys, "nlp_keys": nlp_keys, "a": a, "b": b, "d": d}


def usage(client, key=ADMIN, **params) -> dict:
    response = client.get("/v1/usage", params=params, headers=auth(key))
    assert response.status_code == 200, response.text
    assert {"from", "to", "group_by", "rows", "total"} <= response.json().keys()
    return UsageReport.model_validate(response.json()).model_dump(by_alias=True)


def by_key(report: dict) -> dict[str, dict]:
    return {row["key"]: row for row in report["rows"]}


def test_the_ledger_follows_the_history_rows_to_the_instant(app, world):
    with app.state.service.sessions() as session:
        rows = session.scalars(
            select(UsageInterval).where(UsageInterval.subject_id == world["a"]).order_by(UsageInterval.id)
        ).all()
        stretches = [
            (r.started_at, r.ended_at, r.wasted_from, r.end_state, r.workers, r.cpus, r.memory_gb) for r in rows
        ]
    at = lambda s: T0 + timedelta(seconds=s)  # noqa: E731
    assert stretches == [
        (at(10), at(100), at(70), "RESTARTING", 2, 1.0, 4.0),
        (at(120), at(300), None, "SUCCEEDED", 2, 1.0, 4.0),
    ]


def test_totals_per_job_are_exact_with_attempts_and_wasted_time(client, world):
    report = usage(client, group_by="job", **{"from": iso(-3600), "to": iso(3600)})
    rows = by_key(report)
    a, b, d = rows[world["a"]], rows[world["b"]], rows[world["d"]]
    assert (a["kind"], a["project_id"]) == ("job", world["vision"])
    # a: 90 + 180 s held by 2 workers x 1 CPU x 4 GB; 100 - 70 = 30 s wasted
    assert (a["seconds"], a["worker_seconds"], a["cpu_seconds"], a["memory_gb_seconds"]) == (270, 540, 540, 2160)
    assert (a["wasted_seconds"], a["wasted_cpu_seconds"], a["training_seconds"], a["gpu_seconds"]) == (30, 60, 240, 0)
    assert [(x["attempt"], x["ended"], x["seconds"]) for x in a["attempts"]] == [(1, "SUCCEEDED", 270)]
    # b: failed without a checkpoint: all of it wasted
    assert (b["seconds"], b["cpu_seconds"], b["wasted_seconds"], b["wasted_cpu_seconds"]) == (100, 200, 100, 200)
    assert b["attempts"][0]["ended"] == "FAILED" and b["attempts"][0]["reason"] == "app_error"
    assert (d["seconds"], d["cpu_seconds"], d["wasted_seconds"]) == (200, 200, 0)
    total = report["total"]
    assert (total["cpu_seconds"], total["seconds"], total["wasted_cpu_seconds"]) == (940, 570, 260)


def test_intervals_are_clipped_to_the_window(client, world):
    # [50, 150): a holds 50-100 (wasted 70-100) and 120-150; b holds 60-150, all wasted; d 50-100
    report = usage(client, group_by="job", **{"from": iso(50), "to": iso(150)})
    rows = by_key(report)
    assert (rows[world["a"]]["seconds"], rows[world["a"]]["wasted_seconds"]) == (80, 30)
    assert (rows[world["b"]]["seconds"], rows[world["b"]]["cpu_seconds"], rows[world["b"]]["wasted_seconds"]) == (
        90,
        180,
        90,
    )
    assert rows[world["d"]]["seconds"] == 50
    assert report["from"] == T0 + timedelta(seconds=50) and report["to"] == T0 + timedelta(seconds=150)
    # a window that starts where a stretch ends and ends where one starts sees neither
    empty = by_key(usage(client, group_by="job", **{"from": iso(300), "to": iso(400)}))
    assert empty == {}
    assert by_key(usage(client, group_by="job", **{"from": iso(100), "to": iso(120)})).keys() == {world["b"]}


def test_group_by_project_label_and_day(client, world):
    window = {"from": iso(-3600), "to": iso(3600)}
    projects = by_key(usage(client, group_by="project", **window))
    assert projects[world["vision"]]["cpu_seconds"] == 740 and projects[world["vision"]]["name"] == "vision"
    assert projects[world["nlp"]]["cpu_seconds"] == 200 and projects[world["nlp"]]["kind"] == "project"
    teams = by_key(usage(client, group_by="label:team", **window))
    assert {k: v["cpu_seconds"] for k, v in teams.items()} == {"vision": 540, "nlp": 200, "": 200}
    days = usage(client, group_by="day", **window)
    assert [(row["key"], row["cpu_seconds"]) for row in days["rows"]] == [("2026-01-01", 100), ("2026-01-02", 840)]
    assert days["total"]["cpu_seconds"] == 940


def test_csv_has_the_columns_a_line_per_row_and_the_total(client, world):
    response = client.get(
        "/v1/usage",
        params={"group_by": "project", "from": iso(-3600), "to": iso(3600)},
        headers={**auth(ADMIN), "Accept": "text/csv"},
    )
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/csv")
    lines = list(csv.reader(io.StringIO(response.text)))
    assert tuple(lines[0]) == CSV_COLUMNS
    rows = {line[0]: dict(zip(CSV_COLUMNS, line, strict=True)) for line in lines[1:]}
    assert set(rows) == {world["vision"], world["nlp"], "total"}
    assert float(rows[world["vision"]]["cpu_seconds"]) == 740 and rows[world["vision"]]["name"] == "vision"
    assert float(rows["total"]["cpu_seconds"]) == 940 and float(rows["total"]["wasted_seconds"]) == 130


def test_goodput_is_summed_per_group_and_clipped_to_the_window(client, world):
    """docs/jobs.md "Goodput": held is STARTING + RUNNING + RESTARTING (usage's seconds count RUNNING only).
    a: held 0-300 (start-up 10, restart 20), its 10-100 stretch ended by a worker's death 30 s after its checkpoint
    at 70: kept 240. b: held 50-160, failed with no checkpoint: kept 0. d: held -110 to 100, kept 200."""
    window = {"from": iso(-3600), "to": iso(3600)}
    jobs = by_key(usage(client, group_by="job", **window))
    a = jobs[world["a"]]["goodput"]
    assert (a["held_s"], a["kept_s"], a["goodput"]) == (300, 240, pytest.approx(0.8))
    assert a["lost"] == {
        "start_up_s": 10,
        "restarts_s": 20,
        "hangs_s": 0,
        "recomputed_s": 30,
        "preemption_s": 0,
        "checkpoint_blocking_s": 0,
    }
    assert (jobs[world["b"]]["goodput"]["kept_s"], jobs[world["b"]]["goodput"]["lost"]["recomputed_s"]) == (0, 100)

    projects = by_key(usage(client, group_by="project", **window))
    vision = projects[world["vision"]]["goodput"]  # a and b
    assert (vision["held_s"], vision["kept_s"], vision["goodput"]) == (410, 240, pytest.approx(240 / 410))
    assert projects[world["nlp"]]["goodput"]["kept_s"] == 200
    report = usage(client, group_by="project", **window)
    assert (report["goodput"]["held_s"], report["goodput"]["kept_s"]) == (620, 440)

    # [50, 150): a held 50-100 and 120-150 RUNNING, 100-120 RESTARTING; its 70-100 is redone
    clipped = by_key(usage(client, group_by="job", **{"from": iso(50), "to": iso(150)}))[world["a"]]["goodput"]
    assert (clipped["held_s"], clipped["running_s"], clipped["kept_s"]) == (100, 80, 50)
    assert (clipped["lost"]["restarts_s"], clipped["lost"]["recomputed_s"], clipped["lost"]["start_up_s"]) == (
        20,
        30,
        0,
    )
    # by day: d's start-up and first 100 s the day before, the rest on T0's day
    days = by_key(usage(client, group_by="day", **window))
    assert (days["2026-01-01"]["goodput"]["held_s"], days["2026-01-02"]["goodput"]["held_s"]) == (110, 510)


def test_a_project_sees_its_own_usage_only(client, world):
    window = {"from": iso(-3600), "to": iso(3600)}
    for role in ("member", "viewer"):
        own = usage(client, world["vision_keys"][role], group_by="job", **window)
        assert own["project_id"] == world["vision"] and by_key(own).keys() == {world["a"], world["b"]}
        response = client.get(
            "/v1/usage", params={"project_id": world["nlp"], **window}, headers=auth(world["vision_keys"][role])
        )
        assert response.status_code == 404 and world["nlp"] in response.text
    assert by_key(usage(client, world["vision_keys"]["member"], project_id=world["vision"], **window)).keys() == {
        world["vision"]
    }
    # a cluster-wide admin sees one project when asked, every project otherwise
    assert by_key(usage(client, project_id=world["nlp"], group_by="job", **window)).keys() == {world["d"]}


BAD_QUERIES = [
    ({"group_by": "team"}, "use one of project, job, label:<key>, day"),
    ({"group_by": "label:"}, "a label key is 1 to 63"),
    ({"from": "yesterday"}, "from 'yesterday' is not a date: use ISO 8601"),
    ({"to": "2026-13-01"}, "to '2026-13-01' is not a date"),
    ({"from": "2026-02-01", "to": "2026-01-01"}, "must be before to"),
    ({"from": "2026-01-01", "to": "2026-01-01"}, "must be before to"),
    ({"from": "2000-01-01", "to": "2026-01-01", "group_by": "day"}, "group_by=day covers at most"),
]


def test_bad_queries_are_422_saying_what_to_fix(client):
    for params, says in BAD_QUERIES:
        response = client.get("/v1/usage", params=params, headers=auth(ADMIN))
        assert response.status_code == 422 and says in response.text, (params, response.text)


def test_a_running_stretch_counts_up_to_now(app, client, clock):
    _, keys = make_project(client, "live")
    job = new_job(client, keys["member"], num_workers=2, cpus_per_worker=0.5)
    clock.now = utcnow() - timedelta(seconds=100)
    with app.state.service.sessions.begin() as session:
        job_row = lock_job(session, job)
        set_job_state(session, job_row, S.STARTING, "admitted")
        set_job_state(session, job_row, S.RUNNING, "training_started")
    before = utcnow()
    report = usage(client, keys["viewer"], group_by="job")
    row = by_key(report)[job]
    held = (report["generated_at"] - clock.now).total_seconds()
    assert held >= 100 and (utcnow() - before).total_seconds() + 100 + 1 >= held
    assert row["seconds"] == pytest.approx(held, abs=0.01) and row["cpu_seconds"] == pytest.approx(held, abs=0.01)
    assert row["attempts"][0]["ended"] == ""


def test_a_new_app_on_the_same_database_gives_the_same_numbers(app, client, world, database_url, tmp_path):
    window = {"group_by": "job", "from": iso(-3600), "to": iso(3600)}
    first = usage(client, **window)
    settings = Settings(
        database_url=database_url, storage=str(tmp_path / "s2"), var_dir=str(tmp_path / "v2"), admin_token=ADMIN
    )
    again = create_app(settings, backend=FakeBackend(), run_loops=False)
    with TestClient(again) as second:
        restarted = usage(second, **window)
    assert restarted["rows"] == first["rows"] and restarted["total"] == first["total"]
    assert restarted["total"]["cpu_seconds"] == 940


def test_trials_and_sweeps_and_deployments(app, client, clock):
    project, keys = make_project(client, "search")
    spec = SweepSpec.model_validate(
        {
            "base": {"workload": "digits", "epochs": 2, "scaling": {"num_workers": 2, "cpus_per_worker": 0.5}},
            "search_space": {"scaling.num_workers": {"type": "grid", "values": [1, 2]}},
            "algorithm": "grid",
        }
    )
    sessions = app.state.service.sessions
    with sessions.begin() as session:
        sweep_id = sweeps_repo.create_sweep(session, project, spec).id
    clock.at(0)
    with sessions.begin() as session:
        sweep = lock_sweep(session, sweep_id)
        set_sweep_state(session, sweep, S.STARTING, "admitted")
        set_sweep_state(session, sweep, S.RUNNING, "started")
        one = sweeps_repo.add_trial(session, sweep_id, "exp_00000", {"scaling.num_workers": 1})
        two = sweeps_repo.add_trial(session, sweep_id, "exp_00001", {"scaling.num_workers": 2})
        one_id, two_id = one.id, two.id
        clock.at(10)
        set_trial_state(session, one, TrialState.RUNNING, "started")
        set_trial_state(session, two, TrialState.RUNNING, "started")
        clock.at(70)
        set_trial_state(session, one, TrialState.SUCCEEDED, "completed")  # 60 s x 1 worker x 0.5 CPU
        sweeps_repo.record_trial_metric(session, two, 1, 10, {"val_accuracy": 0.5}, "/ckpt/two/1")
        session.flush()
        session.scalars(select(TrialMetric).where(TrialMetric.trial_id == two_id)).one().created_at = clock.at(40)
        clock.at(110)
        set_trial_state(session, two, TrialState.FAILED, "app_error")  # 100 s x 2 x 0.5; wasted 40-110
    # deployments: 2 replicas x 0.25 CPU while DEPLOYING and HEALTHY, deleted at 100
    with sessions.begin() as session:
        deployment = deployments_repo.create_deployment(session, project, "dep", "digits", "/dep")
        deployments_repo.add_version(
            session,
            deployment,
            checkpoint_id=None,
            checkpoint_path="/nowhere",
            job_id=None,
            checkpoint={},
            config={},
            source={},
            settings={"replicas": 2, "resources": {"cpus": 0.25, "gpus": 0.0}},
        )
        deployment.created_at = T0
        record_deployment_created(session, deployment, "version 1")
        deployment_id = deployment.id
    clock.at(30)
    with sessions.begin() as session:
        set_deployment_state(session, lock_deployment(session, deployment_id), DeploymentState.HEALTHY, "deployed")
    clock.at(100)
    with sessions.begin() as session:
        set_deployment_state(session, lock_deployment(session, deployment_id), DeploymentState.DELETED, "deleted")

    report = usage(client, keys["member"], group_by="job", **{"from": iso(-60), "to": iso(3600)})
    rows = by_key(report)
    sweep_row = rows[sweep_id]
    assert sweep_row["kind"] == "sweep" and sweep_row["cpu_seconds"] == 30 + 100
    trials = {t["trial_id"]: t for t in sweep_row["trials"]}
    assert trials[one_id]["cpu_seconds"] == 30 and trials[one_id]["wasted_seconds"] == 0
    assert (trials[two_id]["seconds"], trials[two_id]["wasted_seconds"], trials[two_id]["wasted_cpu_seconds"]) == (
        100,
        70,
        70,
    )
    deployment_row = rows[deployment_id]
    assert deployment_row["kind"] == "deployment" and deployment_row["name"] == "dep"
    assert (deployment_row["seconds"], deployment_row["worker_seconds"], deployment_row["cpu_seconds"]) == (
        100,
        200,
        50,
    )
    assert [a["attempt"] for a in deployment_row["attempts"]] == [1]
    assert report["total"]["cpu_seconds"] == 180
    # goodput is a job's measure: no sweep, trial or deployment has one, and a report of only those has none
    assert sweep_row["goodput"] is None and deployment_row["goodput"] is None and report["goodput"] is None
    written, backfilled = refill_from_history(app)  # migration 0013 reads trials and deployments the same way
    assert len(written) == 4 and backfilled == written  # 2 trials; the deployment DEPLOYING, then HEALTHY


def test_the_sdk_and_the_cli_read_the_same_report(live, tmp_path, monkeypatch):
    from tests.unit.cli_support import orch
    from tests.unit.sdk_helpers import running, sdk

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    with sdk(live) as admin:
        response = admin.transport.request(
            "POST", "/v1/jobs", json={"workload": "digits", "scaling": {"num_workers": 2, "cpus_per_worker": 0.5}}
        )
        job_id = response.json()["id"]
        running(live, job_id)  # admitted and RUNNING: its stretch is open, counted up to now
        report = admin.usage(group_by="job", start="2026-01-01")
        row = next(row for row in report.rows if row.key == job_id)
        assert row.kind == "job" and row.cpu_seconds == pytest.approx(row.seconds, abs=0.01) and row.seconds > 0
        assert row.goodput is not None and row.goodput.held_s >= row.goodput.kept_s > 0, row.goodput
        text = admin.usage(group_by="job", csv=True)
        assert text.splitlines()[0] == ",".join(CSV_COLUMNS) and job_id in text
    shown = orch(live, "usage", "-g", "job", "--from", "2026-01-01", "-o", "json")
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout)["rows"][0]["key"] == job_id and "from" in json.loads(shown.stdout)
    table = orch(live, "usage", "--group-by", "job")
    assert table.exit_code == 0 and job_id[:8] in table.stdout and "CPU-HOURS" in table.stdout
    assert "GOODPUT" in table.stdout and "%" in table.stdout, table.stdout
    assert orch(live, "usage", "--csv").stdout.startswith("key,kind,name,project_id,seconds")
    bad = orch(live, "usage", "-g", "team")
    assert bad.exit_code == 2 and "use one of project, job, label:<key>, day" in bad.stderr


def refill_from_history(app) -> tuple[list, list]:
    """Migration 0013's backfill, run on this database with its ledger emptied: (the ledger the state engine
    wrote, the ledger the backfill writes). Its own function, not a downgrade and upgrade: on SQLite a batch
    downgrade of a later migration recreates tables, and the foreign keys' cascades empty them."""
    import importlib.util

    from sqlalchemy import delete

    from orchestrator.db.migrate import MIGRATIONS_DIR

    spec = importlib.util.spec_from_file_location(
        "migration_0013", MIGRATIONS_DIR / "versions" / "0013_usage_accounting.py"
    )
    migration = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(migration)

    def stretches():
        with app.state.service.sessions() as session:
            return sorted(
                (r.kind, r.subject_id, r.attempt, r.workers, r.cpus, r.gpus, r.memory_gb, r.started_at, r.ended_at)
                + (r.wasted_from, r.end_state, r.end_reason, r.project_id, r.sweep_id)
                for r in session.scalars(select(UsageInterval))
            )

    written = stretches()
    engine = app.state.service.sessions.kw["bind"]
    with engine.begin() as connection:
        connection.execute(delete(UsageInterval))
    assert stretches() == []
    with engine.begin() as connection:
        migration._backfill(connection)
    return written, stretches()


def test_migration_0013_fills_the_ledger_from_the_history_as_the_hooks_do(app, client, world):
    written, backfilled = refill_from_history(app)
    assert len(written) == 4  # a: two stretches; b and d: one each
    assert backfilled == written
    assert (
        by_key(usage(client, group_by="project", **{"from": iso(-3600), "to": iso(3600)}))[world["vision"]][
            "cpu_seconds"
        ]
        == 740
    )


def test_a_preempted_attempt_is_wasted_from_its_checkpoint_and_a_cancel_is_not(app, client, clock):
    """Preemption (back to QUEUED, reason preempted) ends a stretch wasted from its last checkpoint, and the next
    attempt is its own; a job cancelled while it runs holds until it ends CANCELLED, none of it wasted."""
    _, keys = make_project(client, "shared")
    preempted = new_job(client, keys["member"], num_workers=1, cpus_per_worker=1)
    cancelled = new_job(client, keys["member"], num_workers=1, cpus_per_worker=1)
    move(app, clock, preempted, 0, S.STARTING)
    move(app, clock, preempted, 10, S.RUNNING)
    move(app, clock, cancelled, 10, S.STARTING)
    move(app, clock, cancelled, 20, S.RUNNING)
    checkpoint(app, preempted, 90, 9)
    move(app, clock, preempted, 100, S.QUEUED, "preempted")
    move(app, clock, cancelled, 100, S.CANCELLING, "cancel_requested")
    move(app, clock, cancelled, 105, S.CANCELLED, "cancelled")
    move(app, clock, preempted, 110, S.STARTING)
    move(app, clock, preempted, 120, S.RUNNING)
    move(app, clock, preempted, 200, S.SUCCEEDED)
    rows = by_key(usage(client, keys["viewer"], group_by="job", **{"from": iso(0), "to": iso(300)}))
    attempts = [
        (a["attempt"], a["seconds"], a["wasted_seconds"], a["ended"], a["reason"]) for a in rows[preempted]["attempts"]
    ]
    assert attempts == [(1, 90, 10, "QUEUED", "preempted"), (2, 80, 0, "SUCCEEDED", "x")]
    assert (rows[cancelled]["seconds"], rows[cancelled]["wasted_seconds"]) == (85, 0)
    assert rows[cancelled]["attempts"][0]["ended"] == "CANCELLED"
