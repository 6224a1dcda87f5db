"""Every list the REST API serves is read through an index on PostgreSQL (docs/benchmarks.md, "10,000 jobs").

The database is filled by the benchmark's seeder (``bench/seed_db.py``) at a small size, ANALYZEd, and the
repository functions behind the list routes are called for real; the SQL they emit is captured on the
engine and EXPLAINed with the same parameters. No plan may read jobs, job_metrics, job_events, checkpoints
or trials with a sequential scan. ``enable_seqscan`` is left on: the planner must choose the index on its
own, with statistics of a realistic shape (most jobs ended, 50 metric points each).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest
from sqlalchemy import create_engine, event, select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from bench.api_load import IdleCluster
from bench.seed_db import Sizes, seed
from orchestrator.admission import reserved_by
from orchestrator.db.models import Checkpoint, Deployment, Job, JobState, Sweep, Trial
from orchestrator.loops.scheduler import Scheduler
from orchestrator.repositories import deployments as deployments_repo
from orchestrator.repositories import jobs as jobs_repo
from orchestrator.repositories import sweeps as sweeps_repo
from orchestrator.repositories.paging import encode_cursor
from orchestrator.services.runs import active_demands
from orchestrator.settings import Settings

pytestmark = pytest.mark.postgres

# Big enough that a sequential scan costs the planner more than an index (tables of a few pages are
# always scanned whole), small enough to seed in a few seconds.
SIZES = Sizes(
    jobs=2_000,
    projects=10,
    metrics_per_job=50,
    checkpoints_per_job=5,
    sweeps=40,
    trials_per_sweep=20,
    deployments=20,
    queued=100,
    running=10,
)
WATCHED = {"jobs", "job_metrics", "job_events", "checkpoints", "trials"}


@pytest.fixture(scope="module")
def engine(postgres_server) -> Iterator[Engine]:
    name = f"orch_plans_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = postgres_server.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://")
    engine = create_engine(f"{base}/{name}")
    try:
        seed(engine, SIZES)
        with engine.begin() as conn:
            conn.exec_driver_sql("ANALYZE")
        yield engine
    finally:
        engine.dispose()
        with psycopg.connect(postgres_server, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def sessions(engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


@contextmanager
def captured(engine: Engine, only_selects: bool = True) -> Iterator[list[tuple[str, object]]]:
    """The SELECTs (or every statement) the engine runs inside the block, with their parameters."""
    statements: list[tuple[str, object]] = []

    def keep(conn, cursor, statement, parameters, context, executemany):
        if not only_selects or statement.lstrip().upper().startswith("SELECT"):
            statements.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", keep)
    try:
        yield statements
    finally:
        event.remove(engine, "before_cursor_execute", keep)


def scans(plan: dict) -> Iterator[tuple[str, str]]:
    """(node type, relation) of every node of an EXPLAIN (FORMAT JSON) plan that reads a table."""
    if "Relation Name" in plan:
        yield plan["Node Type"], plan["Relation Name"]
    for child in plan.get("Plans", []):
        yield from scans(child)


def plans_of(engine: Engine, statements: list[tuple[str, object]]) -> list[tuple[str, list[tuple[str, str]]]]:
    out = []
    with engine.connect() as conn:
        for statement, parameters in statements:
            (result,) = conn.exec_driver_sql("EXPLAIN (FORMAT JSON) " + statement, parameters).one()
            out.append((statement, list(scans(result[0]["Plan"]))))
    return out


def _some(session: Session, model, *where, offset: int = 0):
    return session.scalars(select(model).where(*where).order_by(model.id).offset(offset).limit(1)).one()


def _deep_cursor(session: Session, project_id: str | None) -> str:
    """The cursor of a page about 80 % down a project's (or everything's) newest-first list of jobs."""
    query = select(Job.created_at, Job.id).order_by(Job.created_at, Job.id)
    if project_id is not None:
        query = query.where(Job.project_id == project_id)
    count = len(session.execute(query).all())
    created_at, job_id = session.execute(query.offset(count // 5).limit(1)).one()
    return encode_cursor([created_at, job_id])


def _targets(session: Session) -> dict:
    """The rows and cursors the calls below page through (read before the capture: not the routes' SQL)."""
    ended = _some(session, Job, Job.state == JobState.SUCCEEDED, offset=100)
    checkpoint = _some(session, Checkpoint, Checkpoint.job_id == ended.id, offset=2)
    sweep = _some(session, Sweep, offset=5)
    return {
        "job": ended,
        "deep": {scope: _deep_cursor(session, scope) for scope in (ended.project_id, None)},
        "checkpoint_cursor": encode_cursor([checkpoint.step, checkpoint.id]),
        "sweep": sweep,
        "trial": _some(session, Trial, Trial.sweep_id == sweep.id),
        "deployment": _some(session, Deployment),
    }


def _list_routes(session: Session, targets: dict) -> None:
    """What the list routes call, with the filters and cursors they pass."""
    job_id = targets["job"].id
    project = targets["job"].project_id
    for scope in (project, None):  # a project's key; a cluster-wide admin
        deep = targets["deep"][scope]
        jobs_repo.list_jobs(session, scope, limit=50)
        jobs_repo.list_jobs(session, scope, cursor=deep, limit=50)
        jobs_repo.list_jobs(session, scope, states=[JobState.RUNNING], limit=50)
        jobs_repo.list_jobs(session, scope, states=[JobState.QUEUED, JobState.RUNNING], limit=50)
        jobs_repo.list_jobs(session, scope, states=[JobState.FAILED], cursor=deep, limit=50)
        jobs_repo.list_jobs(session, scope, labels={"run": "r07"}, limit=50)
        jobs_repo.list_jobs(session, scope, name_prefix="resnet-0001", limit=50)
    jobs_repo.get_job(session, job_id, project)
    metrics, next_metrics = jobs_repo.page_metrics(session, job_id, None, 20)
    jobs_repo.page_metrics(session, job_id, next_metrics, 20)
    events, next_events = jobs_repo.page_events(session, job_id, None, 2)
    jobs_repo.page_events(session, job_id, next_events, 2)
    jobs_repo.last_transition(session, job_id)
    jobs_repo.page_checkpoints(session, job_id, None, 2)
    jobs_repo.page_checkpoints(session, job_id, targets["checkpoint_cursor"], 2)
    assert metrics and events and next_metrics and next_events  # the pages were not empty

    sweep = targets["sweep"]
    sweeps_repo.list_sweeps(session, sweep.project_id, None, None, 50)
    sweeps_repo.list_sweeps(session, None, None, None, 50)
    trials, next_trials = sweeps_repo.page_trials(session, sweep.id, None, 5)
    sweeps_repo.page_trials(session, sweep.id, next_trials, 5)
    sweeps_repo.page_events(session, sweep.id, None, 50)
    sweeps_repo.page_trial_events(session, targets["trial"].id, None, 50)
    sweeps_repo.page_trial_metrics(session, targets["trial"].id, None, 50)
    sweeps_repo.running_trials(session, sweep.id)  # the sweep's control signal, polled by every trial rank
    sweeps_repo.trial_progress(session, [targets["trial"].id])  # its trials' hang detection
    assert trials and next_trials

    deployment = targets["deployment"]
    deployments_repo.list_deployments(session, deployment.project_id, None, None, 50)
    deployments_repo.page_events(session, deployment.id, None, 50)


def test_no_list_route_reads_a_big_table_sequentially(engine, sessions):
    with sessions() as session:
        targets = _targets(session)
        with captured(engine) as statements:
            _list_routes(session, targets)
    plans = plans_of(engine, statements)
    assert len(plans) > 30  # the capture saw the repositories' queries
    listed = [s for s, _ in plans if "FROM jobs" in s and "ORDER BY jobs.created_at DESC, jobs.id DESC" in s]
    assert len(listed) == 14, listed  # every list_jobs call above
    sequential = [(s, p) for s, p in plans if any(n == "Seq Scan" and t in WATCHED for n, t in p)]
    assert sequential == [], "sequential scans:\n" + "\n\n".join(f"{s}\n  -> {p}" for s, p in sequential)
    indexed = {t for _, p in plans for n, t in p if "Index" in n}
    assert indexed >= WATCHED, f"not read through an index: {WATCHED - indexed}"


def test_the_scheduler_reads_no_ended_job(engine, sessions):
    """The scheduler's tick reads the queued and the active runs through the state indexes: ended jobs
    (most of the table) are neither scanned nor loaded."""
    with sessions() as session, captured(engine) as statements:
        queued = jobs_repo.queued_jobs(session)
        active = jobs_repo.active_jobs(session)
    assert len(queued) == SIZES.queued and len(active) == SIZES.running
    assert {j.state for j in queued + active} == {JobState.QUEUED, JobState.RUNNING}
    plans = plans_of(engine, statements)
    job_reads = [(s, p) for s, p in plans if "FROM jobs" in s]
    assert len(job_reads) == 2
    for statement, scanned in job_reads:
        assert ("Seq Scan", "jobs") not in scanned, (statement, scanned)


def test_a_queue_that_stays_put_costs_the_scheduler_no_writes(engine, sessions):
    """Hundreds of jobs waiting for a busy cluster: once each one's reason is noted, a tick only reads."""
    with sessions() as session:
        held = reserved_by(active_demands(session))["CPU"]
    cluster = IdleCluster(cpus=held)  # the running jobs hold every CPU
    scheduler = Scheduler(sessions, cluster, Settings(database_url=engine.url.render_as_string(hide_password=False)))
    scheduler.tick()
    with captured(engine, only_selects=False) as statements:
        scheduler.tick()
    writes = [
        s for s, _ in statements if s.lstrip().upper().startswith(("UPDATE", "INSERT", "DELETE")) or "FOR UPDATE" in s
    ]
    assert writes == []
    # the queued and active runs, the waiting deployments, serving's reservation, the registered clusters and the
    # projects' bindings (docs/clusters.md): not one per job
    assert len(statements) <= 11, [s for s, _ in statements]
    with sessions() as session:
        queued = jobs_repo.queued_jobs(session)
    assert len(queued) == SIZES.queued
    assert {(j.reason, j.message.split(":")[0]) for j in queued} == {
        ("insufficient_resources", "waiting for resources")
    }


def test_usage_reads_its_ledger_through_an_index(engine, sessions):
    """``GET /v1/usage`` (docs/usage.md, "The endpoint") over the last 30 days of a year of history, for one project and
    for every project, each ``group_by``: the ledger (filled from the seeded history by migration 0013's backfill) is
    read through its ``ended_at`` indexes, the names and labels by primary key."""
    from datetime import timedelta

    from bench.seed_db import NEWEST
    from orchestrator.usage import usage_report

    start = NEWEST - timedelta(days=30)
    with sessions() as session:
        project_id = session.scalar(select(Job.project_id).order_by(Job.id).limit(1))
        plans = {}
        for scope in (project_id, None):
            with captured(engine) as statements:
                for group_by in ("project", "job", "label:team", "day"):
                    report = usage_report(session, project_id=scope, start=start, end=NEWEST, group_by=group_by)
                    assert report.rows and report.total.cpu_seconds > 0 and report.goodput is not None
            plans[scope] = plans_of(engine, statements)
    ledger = [(s, p) for scoped in plans.values() for s, p in scoped if "FROM usage_intervals" in s]
    assert len(ledger) == 16  # two range reads per report
    indexed = ("Index Scan", "Index Only Scan", "Bitmap Heap Scan")  # a bitmap heap scan reads what an index found
    assert all(any(n in indexed and t == "usage_intervals" for n, t in p) for _, p in ledger), ledger

    def sequential(scoped):
        return [(s, p) for s, p in scoped if any(n == "Seq Scan" and t in WATCHED | {"usage_intervals"} for n, t in p)]

    # A project's reports read nothing whole: the ledger by range, names and labels by primary key, its jobs'
    # history, checkpoints and last reports (their goodput) by job id.
    assert sequential(plans[project_id]) == [], "sequential scans:\n" + "\n\n".join(
        f"{s}\n  -> {p}" for s, p in sequential(plans[project_id])
    )
    # Every project's: the jobs of 30 days are a twelfth of a year's history, and PostgreSQL reads that share of the
    # (small) history and checkpoint tables whole rather than by index. Only those two goodput reads may, never the
    # ledger, the names or the metric points.
    whole = sequential(plans[None])
    assert {t for _, p in whole for n, t in p if n == "Seq Scan"} <= {"job_events", "checkpoints"}, whole
    assert all("= ANY" in s for s, _ in whole), whole


def test_a_new_leader_seeds_fair_share_from_the_ledger_through_an_index(engine, sessions):
    """A new leader's first tick reads the last 5 half-lives of the usage ledger (``scheduling.share_memory``;
    docs/scheduling.md, "The order, each tick"): two range reads on ``ended_at``, never the whole ledger."""
    from bench.seed_db import NEWEST
    from orchestrator.scheduling.share_memory import seed_shares

    with sessions() as session, captured(engine) as statements:
        seed_shares(session, {"CPU": 64.0, "GPU": 8.0}, NEWEST, half_life_s=600.0)
    plans = plans_of(engine, statements)
    assert len(plans) == 2 and all("FROM usage_intervals" in s for s, _ in plans), plans
    sequential = [(s, p) for s, p in plans if ("Seq Scan", "usage_intervals") in p]
    assert sequential == [], sequential
    indexed = ("Index Scan", "Index Only Scan", "Bitmap Heap Scan")
    assert all(any(n in indexed and t == "usage_intervals" for n, t in p) for _, p in plans), plans
