"""Fill a PostgreSQL database with a year of history: jobs, their events, metrics and checkpoints, sweeps
and trials, deployments (docs/benchmarks.md, "10,000 jobs").

    .venv/bin/python bench/seed_db.py                      # a fresh database orch_bench on 127.0.0.1:5432
    .venv/bin/python bench/seed_db.py postgresql+psycopg://postgres@127.0.0.1:5432/mydb --jobs 1000

The schema comes from the migrations (``upgrade_head``), the rows from bulk inserts through SQLAlchemy Core
(no ORM objects, no state engine: these are finished histories, not transitions). Deterministic: the same
seed and sizes give the same rows (ids included), timestamps counted back from a fixed instant.

Most jobs have ended (succeeded, failed, cancelled); the newest ``--queued`` are QUEUED (no attempt yet) and
``--running`` RUNNING. Each project has a member key ``seed-key-<project index>`` (``key_for``).
"""

from __future__ import annotations

import argparse
import hashlib
import random
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
from sqlalchemy import Engine, create_engine, insert, make_url

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.db.migrate import upgrade_head
from orchestrator.db.models import (
    ApiKey,
    Checkpoint,
    Deployment,
    DeploymentEvent,
    DeploymentVersion,
    Job,
    JobEvent,
    JobLabel,
    JobMetric,
    Project,
    Sweep,
    SweepEvent,
    Trial,
    TrialEvent,
    TrialMetric,
)
from orchestrator.planner import plan_job
from orchestrator_contract.jobs import JobSpec
from orchestrator_contract.sweeps import SweepSpec

DEFAULT_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/orch_bench"
# The newest job is this old; the oldest is about a year older. Fixed, so two runs give the same rows.
NEWEST = datetime(2026, 11, 20, tzinfo=UTC)
YEAR = timedelta(days=365)
NAME_PREFIXES = ("resnet", "tiny-gpt", "digits", "bert-ft", "vit", "mlp-ablation", "lr-scan", "nightly")
TEAMS = ("vision", "nlp", "speech", "infra", "research")
CHUNK = 200  # jobs per batch of inserts (200 x 200 metric points a statement)


@dataclass(frozen=True)
class Sizes:
    jobs: int = 10_000
    projects: int = 20
    metrics_per_job: int = 200
    checkpoints_per_job: int = 5
    sweeps: int = 200
    trials_per_sweep: int = 20
    deployments: int = 50
    queued: int = 500
    running: int = 20


def key_for(project_index: int) -> str:
    """The member key the seeder gives project ``project_index`` (for benchmarks)."""
    return f"seed-key-{project_index:02d}"


def _id(rng: random.Random) -> str:
    return f"{rng.getrandbits(128):032x}"


def _job_state(index: int, sizes: Sizes, rng: random.Random) -> str:
    """The newest jobs are live: queued ones newest of all, running ones just before them."""
    from_newest = sizes.jobs - 1 - index
    if from_newest < sizes.queued:
        return "QUEUED"
    if from_newest < sizes.queued + sizes.running:
        return "RUNNING"
    roll = rng.random()
    return "SUCCEEDED" if roll < 0.82 else "FAILED" if roll < 0.94 else "CANCELLED"


def _templates() -> list[tuple[dict, dict]]:
    """A few (spec, plan) pairs, made by the real contract and planner so the API reads them back."""
    out = []
    for workers, epochs in ((1, 3), (2, 5), (2, 10)):
        spec = JobSpec(workload="digits", scaling={"num_workers": workers}, epochs=epochs)
        out.append((spec.model_dump(mode="json"), plan_job(spec).model_dump(mode="json")))
    return out


def seed(engine: Engine, sizes: Sizes = Sizes(), seed_value: int = 0, quiet: bool = True) -> dict[str, int]:
    """Migrate ``engine``'s database and fill it; returns how many rows of each table went in."""
    rng = random.Random(seed_value)
    upgrade_head(engine)
    counts: dict[str, int] = {}

    def put(conn, model, rows: list[dict]) -> None:
        if rows:
            conn.execute(insert(model), rows)
            counts[model.__tablename__] = counts.get(model.__tablename__, 0) + len(rows)

    step = YEAR / max(sizes.jobs, 1)
    oldest = NEWEST - YEAR
    templates = _templates()
    projects = [_id(rng) for _ in range(sizes.projects)]
    with engine.begin() as conn:
        put(
            conn,
            Project,
            [
                {"id": p, "name": f"team-{i:02d}", "created_at": oldest - timedelta(days=1)}
                for i, p in enumerate(projects)
            ],
        )
        put(
            conn,
            ApiKey,
            [
                {
                    "id": _id(rng),
                    "project_id": p,
                    "name": "seed",
                    "role": "member",
                    "key_hash": hashlib.sha256(key_for(i).encode()).hexdigest(),
                    "prefix": key_for(i)[:8],
                    "cluster_wide": False,
                    "created_at": oldest,
                }
                for i, p in enumerate(projects)
            ],
        )

    started_jobs: list[tuple[str, datetime]] = []  # (id, created_at) of jobs that ran: deployments serve them
    started = time.monotonic()
    for first in range(0, sizes.jobs, CHUNK):
        jobs, labels, events, metrics, checkpoints = [], [], [], [], []
        for index in range(first, min(first + CHUNK, sizes.jobs)):
            job_id = _id(rng)
            created = oldest + step * index + timedelta(seconds=rng.randint(0, 59))
            state = _job_state(index, sizes, rng)
            spec, plan = templates[index % len(templates)]
            name = f"{NAME_PREFIXES[index % len(NAME_PREFIXES)]}-{index:05d}"
            job_labels = {"team": TEAMS[index % len(TEAMS)], "run": f"r{index % 100:02d}"}
            ran = state != "QUEUED"
            begun = created + timedelta(seconds=rng.randint(1, 600)) if ran else None
            ended = begun + timedelta(minutes=rng.randint(2, 240)) if ran and state != "RUNNING" else None
            points = sizes.metrics_per_job if state == "SUCCEEDED" else sizes.metrics_per_job // 2 if ran else 0
            last_loss = round(2.0 / (1 + points), 4)
            jobs.append(
                {
                    "id": job_id,
                    "project_id": projects[index % sizes.projects],
                    "name": name,
                    "workload": "digits",
                    "spec": {**spec, "name": name, "labels": job_labels},
                    "priority": 0 if state == "QUEUED" else rng.choice((0, 0, 0, 10, 100)),
                    "state": state,
                    "reason": {"QUEUED": "insufficient_resources", "RUNNING": "running"}.get(state, state.lower()),
                    "message": "",
                    "attempt": 1 if ran else 0,
                    "idempotency_key": None,
                    "token_hash": "",
                    "plan": plan,
                    "latest_metrics": {"loss": last_loss, "epoch": 4, "step": points} if points else None,
                    "result": {"val_accuracy": round(0.9 + rng.random() / 20, 4)} if state == "SUCCEEDED" else None,
                    "created_at": created,
                    "updated_at": ended or begun or created,
                    "started_at": begun,
                    "finished_at": ended,
                }
            )
            labels += [{"job_id": job_id, "key": k, "value": v} for k, v in job_labels.items()]
            history = [(None, "QUEUED", created)]
            if ran:
                history += [("QUEUED", "STARTING", begun), ("STARTING", "RUNNING", begun + timedelta(seconds=20))]
            if ended:
                history.append(("RUNNING", state, ended))
            events += [
                {
                    "job_id": job_id,
                    "from_state": a,
                    "to_state": b,
                    "reason": b.lower(),
                    "message": "",
                    "attempt": 1 if ran else 0,
                    "created_at": at,
                }
                for a, b, at in history
            ]
            if points:
                every = ((ended or NEWEST) - begun) / (points + 1)
                metrics += [
                    {
                        "job_id": job_id,
                        "attempt": 1,
                        "epoch": s * 5 // points,
                        "step": s,
                        "values": {"loss": round(2.0 / (1 + s), 4), "lr": 0.01},
                        "created_at": begun + every * (s + 1),
                    }
                    for s in range(1, points + 1)
                ]
                marks = sorted(
                    {max(1, points * (c + 1) // sizes.checkpoints_per_job) for c in range(sizes.checkpoints_per_job)}
                )
                checkpoints += [
                    {
                        "job_id": job_id,
                        "attempt": 1,
                        "epoch": s * 5 // points,
                        "step": s,
                        "path": f"/storage/{job_id}/checkpoint_{s:06d}",
                        "size_bytes": 1_000_000,
                        "metrics": {"loss": round(2.0 / (1 + s), 4)},
                        "created_at": begun + every * (s + 1),
                    }
                    for s in marks
                ]
                started_jobs.append((job_id, created))
        with engine.begin() as conn:
            put(conn, Job, jobs)
            put(conn, JobLabel, labels)
            put(conn, JobEvent, events)
            put(conn, JobMetric, metrics)
            put(conn, Checkpoint, checkpoints)
        if not quiet:
            print(f"  jobs {first + len(jobs):>6} of {sizes.jobs} ({time.monotonic() - started:.0f} s)", flush=True)

    _seed_sweeps(engine, sizes, rng, projects, put)
    _seed_deployments(engine, sizes, rng, projects, started_jobs, put)
    _fill_usage(engine, counts)
    return counts


def _fill_usage(engine: Engine, counts: dict[str, int]) -> None:
    """The usage ledger (docs/usage.md) of the seeded history, as migration 0013 fills it for runs that existed
    before it: the state engine's rules applied to the history rows (the bulk inserts bypass the engine)."""
    import importlib.util

    from orchestrator.db.migrate import MIGRATIONS_DIR

    path = MIGRATIONS_DIR / "versions" / "0013_usage_accounting.py"
    spec = importlib.util.spec_from_file_location("migration_0013", path)
    migration = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(migration)
    with engine.begin() as conn:
        migration._backfill(conn)
        counts["usage_intervals"] = conn.exec_driver_sql("SELECT count(*) FROM usage_intervals").scalar()


def _seed_sweeps(engine: Engine, sizes: Sizes, rng: random.Random, projects: list[str], put) -> None:
    base = JobSpec(workload="digits")
    spec = SweepSpec(
        base=base,
        search_space={"lr.base": {"type": "loguniform", "low": 1e-4, "high": 0.5}},
        num_samples=sizes.trials_per_sweep,
    )
    spec_json = spec.model_dump(mode="json")
    step = YEAR / max(sizes.sweeps, 1)
    sweeps, sweep_events, trials, trial_events, trial_metrics = [], [], [], [], []
    for index in range(sizes.sweeps):
        sweep_id = _id(rng)
        created = NEWEST - YEAR + step * index
        ended = created + timedelta(hours=rng.randint(1, 12))
        name = f"sweep-{NAME_PREFIXES[index % len(NAME_PREFIXES)]}-{index:04d}"
        sweeps.append(
            {
                "id": sweep_id,
                "project_id": projects[index % len(projects)],
                "name": name,
                "workload": "digits",
                "spec": {**spec_json, "name": name},
                "priority": 0,
                "state": "SUCCEEDED",
                "reason": "succeeded",
                "message": "",
                "attempt": 1,
                "token_hash": "",
                "best_trial_id": None,
                "created_at": created,
                "updated_at": ended,
                "started_at": created + timedelta(seconds=30),
                "finished_at": ended,
            }
        )
        sweep_events += [
            {
                "sweep_id": sweep_id,
                "from_state": a,
                "to_state": b,
                "reason": b.lower(),
                "message": "",
                "attempt": 1,
                "created_at": at,
            }
            for a, b, at in (
                (None, "QUEUED", created),
                ("QUEUED", "STARTING", created),
                ("STARTING", "RUNNING", created),
                ("RUNNING", "SUCCEEDED", ended),
            )
        ]
        for number in range(1, sizes.trials_per_sweep + 1):
            trial_id = _id(rng)
            epochs = rng.choice((1, 4, 16))
            state = "SUCCEEDED" if epochs == 16 else "STOPPED"
            best = round(0.5 + rng.random() / 2, 4)
            trials.append(
                {
                    "id": trial_id,
                    "sweep_id": sweep_id,
                    "tune_id": f"trial_{number - 1:05d}",
                    "number": number,
                    "config": {"lr.base": round(10 ** rng.uniform(-4, -0.3), 6)},
                    "state": state,
                    "reason": state.lower(),
                    "message": "",
                    "iterations": epochs,
                    "latest_metrics": {"val_accuracy": best},
                    "best_metric": best,
                    "best_epoch": epochs,
                    "checkpoint_path": None,
                    "stopped_early": state == "STOPPED",
                    "created_at": created,
                    "updated_at": ended,
                    "started_at": created + timedelta(seconds=60),
                    "finished_at": ended,
                }
            )
            trial_events += [
                {
                    "trial_id": trial_id,
                    "from_state": a,
                    "to_state": b,
                    "reason": b.lower(),
                    "message": "",
                    "attempt": 1,
                    "created_at": created,
                }
                for a, b in ((None, "PENDING"), ("PENDING", "RUNNING"), ("RUNNING", state))
            ]
            trial_metrics += [
                {
                    "trial_id": trial_id,
                    "epoch": e,
                    "step": e * 10,
                    "values": {"val_accuracy": best},
                    "checkpoint_path": None,
                    "created_at": created,
                }
                for e in range(1, epochs + 1)
            ]
    with engine.begin() as conn:
        put(conn, Sweep, sweeps)
        put(conn, SweepEvent, sweep_events)
        put(conn, Trial, trials)
        put(conn, TrialEvent, trial_events)
        put(conn, TrialMetric, trial_metrics)


def _seed_deployments(
    engine: Engine, sizes: Sizes, rng: random.Random, projects: list[str], started_jobs: list[tuple[str, datetime]], put
) -> None:
    """Most deleted long ago, the newest few HEALTHY (0 CPUs a replica, as the default: no admission share)."""
    settings = {"replicas": 1, "batching": None, "resources": {"cpus": 0.0, "gpus": 0.0}}
    deployments, versions, events = [], [], []
    for index in range(min(sizes.deployments, len(started_jobs))):
        deployment_id = _id(rng)
        job_id, created = started_jobs[index * len(started_jobs) // max(sizes.deployments, 1)]
        live = index >= sizes.deployments - 10
        state = "HEALTHY" if live else "DELETED"
        name = f"model-{index:03d}"
        deployments.append(
            {
                "id": deployment_id,
                "project_id": projects[index % len(projects)],
                "name": name,
                "workload": "digits",
                "route_prefix": f"/{name}",
                "state": state,
                "reason": state.lower(),
                "message": "",
                "version": 1,
                "live_version": 1,
                "failed_version": None,
                "rollout_started_at": None,
                "observed": None,
                "created_at": created + timedelta(days=1),
                "updated_at": created + timedelta(days=2),
                "deleted_at": None if live else created + timedelta(days=2),
            }
        )
        versions.append(
            {
                "deployment_id": deployment_id,
                "version": 1,
                "checkpoint_id": None,
                "checkpoint_path": f"/storage/{job_id}/checkpoint_000200",
                "job_id": job_id,
                "checkpoint": {"epoch": 5, "step": 200, "attempt": 1, "metrics": {}},
                "config": {},
                "source": {"job_id": job_id},
                "settings": settings,
                "note": "",
                "created_at": created + timedelta(days=1),
            }
        )
        events += [
            {
                "deployment_id": deployment_id,
                "from_state": None,
                "to_state": "DEPLOYING",
                "reason": "created",
                "message": "",
                "version": 1,
                "created_at": created,
            },
            {
                "deployment_id": deployment_id,
                "from_state": "DEPLOYING",
                "to_state": state,
                "reason": state.lower(),
                "message": "",
                "version": 1,
                "created_at": created,
            },
        ]
    with engine.begin() as conn:
        put(conn, Deployment, deployments)
        put(conn, DeploymentVersion, versions)
        put(conn, DeploymentEvent, events)


def fresh_database(url: str) -> None:
    """Drop and create the database ``url`` names (connecting to its server's ``postgres`` database)."""
    parsed = make_url(url)
    admin = parsed.set(drivername="postgresql", database="postgres").render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{parsed.database}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{parsed.database}"')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url", nargs="?", default=DEFAULT_URL, help=f"PostgreSQL URL (default {DEFAULT_URL})")
    parser.add_argument("--keep", action="store_true", help="seed the database as it is (default: drop and create it)")
    parser.add_argument("--seed", type=int, default=0)
    for field, default in Sizes.__dataclass_fields__.items():
        parser.add_argument(f"--{field.replace('_', '-')}", type=int, default=default.default)
    args = parser.parse_args()
    sizes = Sizes(**{f: getattr(args, f) for f in Sizes.__dataclass_fields__})
    if not args.keep:
        fresh_database(args.url)
    engine = create_engine(args.url)
    started = time.monotonic()
    counts = seed(engine, sizes, args.seed, quiet=False)
    with engine.begin() as conn:
        conn.exec_driver_sql("ANALYZE")
    engine.dispose()
    print(f"seeded {args.url} in {time.monotonic() - started:.1f} s:")
    for table, n in counts.items():
        print(f"  {table:<20} {n:>9,}")


if __name__ == "__main__":
    main()
