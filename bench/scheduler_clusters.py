"""The scheduler's tick over three Ray clusters against its tick over one, side by side on one seeded database
(docs/benchmarks.md, "10,000 jobs"; issue 31: three clusters within 1.5x of one).

    .venv/bin/python bench/scheduler_clusters.py --seed      # a fresh orch_bench_clusters, dropped at the end
    .venv/bin/python bench/scheduler_clusters.py --seed --rounds 20 --ticks 10 --profile

The database is bench/api_load.py's (10,000 ended jobs, 500 queued, 20 running, 20 projects), with the default
cluster registered as the service registers it on start. Two arms, each its own ``Scheduler`` kept for the
whole run, over stand-in clusters (bench/api_load.py's ``IdleCluster``: a capacity, nothing ever submitted):

- **one**: the database as the service has it today with one cluster: the default cluster's row only, no
  project bound, every running job on it; a lone backend whose CPUs the running jobs hold (``measure_tick``);
- **three**: the default cluster and two registered, ``gpu-a`` and ``gpu-b`` (with labels), reached through a
  ``ClusterBackends`` registry; of the 20 projects a quarter is bound to none (the default only), a quarter to
  gpu-b, a quarter to gpu-a and gpu-b, a quarter to all three; each running job moved to one of its project's
  clusters, and each cluster's stand-in holds exactly what the running jobs on it hold.

In both arms every queued job is placed (three: on a cluster its project may use) and planned, and waits:
nothing is admitted, failed or preempted (each tick's plan is checked, and the jobs' states at the end).

The arms share the one database, so the rows of "three" (the two clusters, the bindings, the running jobs'
``cluster``) are written in one transaction before each of its blocks and removed in one transaction before
each block of "one": each arm's ticks see exactly its own world, never a mix. A block is one untimed tick
(the first after a switch notes the waiting reasons that changed with the world: up to 500 row writes that a
steady queue does not make) then ``--ticks`` timed ticks; rounds alternate which arm goes first, so both meet
the machine's load alike. Printed: the medians of each arm's wall time and of this process's CPU time per tick
(the Python side, which hardly moves with other load; PostgreSQL's own work is in the wall time only), and the
ratio three / one. With ``--profile`` (or when the ratio misses 1.5), one tick of each arm under cProfile.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402
from sqlalchemy import delete, event, func, make_url, select, update  # noqa: E402

from bench.api_load import IdleCluster, seed_fresh  # noqa: E402
from orchestrator.admission import reserved_by  # noqa: E402
from orchestrator.backend.registry import ClusterBackends  # noqa: E402
from orchestrator.db.engine import make_engine, make_session_factory  # noqa: E402
from orchestrator.db.models import Cluster, Job, Project, ProjectCluster  # noqa: E402
from orchestrator.loops import scheduler as scheduler_module  # noqa: E402
from orchestrator.loops.scheduler import Scheduler  # noqa: E402
from orchestrator.repositories import clusters as clusters_repo  # noqa: E402
from orchestrator.services.runs import active_runs, queued_runs  # noqa: E402
from orchestrator.settings import Settings  # noqa: E402
from orchestrator.states.jobs import TERMINAL  # noqa: E402

DEFAULT_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/orch_bench_clusters"
GOAL = 1.5  # issue 31: three clusters' tick within 1.5x of one cluster's
DEFAULT = "local"
OTHERS = {  # name -> (address, labels)
    "gpu-a": ("http://gpu-a:8265", {"gpu": "h100", "region": "eu"}),
    "gpu-b": ("http://gpu-b:8265", {"gpu": "a100", "region": "us"}),
}
# Project team-NN's clusters by NN % 4: none bound (the default only), one, two, all three.
BINDINGS = ((), ("gpu-b",), ("gpu-a", "gpu-b"), (DEFAULT, "gpu-a", "gpu-b"))


def _layout(sessions) -> dict:
    """Which clusters each project is bound to, and which cluster each running job is on, in "three"."""
    with sessions() as session:
        running = list(
            session.execute(
                select(Job.id, Project.id, Project.name)
                .join(Project, Project.id == Job.project_id)
                .where(Job.state == "RUNNING")
                .order_by(Project.name, Job.created_at)
            )
        )
        projects = list(session.execute(select(Project.id, Project.name)))
    bound = {pid: BINDINGS[int(name.rsplit("-", 1)[1]) % len(BINDINGS)] for pid, name in projects}
    count = Counter()
    on = {}
    for job_id, project_id, _ in running:  # each on the least used of its project's clusters
        pick = min(bound[project_id] or (DEFAULT,), key=lambda name: count[name])
        on[job_id] = pick
        count[pick] += 1
    return {"bound": bound, "on": on}


def _switch(sessions, arm: str, layout: dict) -> None:
    """The rows of ``arm``'s world, written in one transaction: no tick sees half of it."""
    with sessions.begin() as session:
        session.execute(delete(ProjectCluster))
        session.execute(delete(Cluster).where(Cluster.name.in_(list(OTHERS))))
        session.execute(update(Job).where(Job.id.in_(list(layout["on"]))).values(cluster=None))
        if arm == "one":
            return
        rows = {DEFAULT: clusters_repo.get_cluster(session, DEFAULT)}
        for name, (address, labels) in OTHERS.items():
            rows[name] = clusters_repo.create_cluster(session, name, address, labels=labels)
        for project_id, names in layout["bound"].items():
            if names:
                clusters_repo.set_bindings(session, project_id, [rows[n] for n in names])
        for name in rows:
            ids = [job_id for job_id, on in layout["on"].items() if on == name]
            session.execute(update(Job).where(Job.id.in_(ids)).values(cluster=name))


def _held(sessions) -> dict[str, float]:
    """CPUs the running jobs hold on each cluster (None: the default)."""
    with sessions() as session:
        runs = active_runs(session)
    by: dict[str, list] = {}
    for run in runs:
        by.setdefault(run.cluster or DEFAULT, []).append(run.request)
    return {name: reserved_by(requests)["CPU"] for name, requests in by.items()}


def _largest_queued_cpus(sessions) -> float:
    with sessions() as session:
        return max(q.demand.total.get("CPU", 0.0) for q in queued_runs(session))


def _check(plan, queued: int, arm: str) -> None:
    """Every queued job waits: a tick that admitted, failed or preempted would change the database."""
    if plan is None or plan.admit or plan.fail or plan.preemption is not None or len(plan.waits) != queued:
        raise SystemExit(
            f"{arm}: the tick did not leave every queued job waiting: admit {plan and plan.admit}, fail "
            f"{plan and plan.fail}, preemption {plan and plan.preemption}, waits {plan and len(plan.waits)}/{queued}"
        )


def _placed_once(scheduler: Scheduler, queued: int) -> tuple[Counter, Counter]:
    """One tick whose placement is recorded: how many queued runs each cluster got, and the reasons of the plan."""
    placements: list = []
    original = scheduler_module.place

    def recording(*args, **kwargs):
        placed = original(*args, **kwargs)
        placements.append(placed)
        return placed

    scheduler_module.place = recording
    try:
        plan = scheduler.tick()
    finally:
        scheduler_module.place = original
    _check(plan, queued, "three")
    per_cluster = Counter(placements[0].cluster.values())
    per_cluster.update({f"(none: {reason})": 1 for reason, _ in placements[0].waits.values()})
    return per_cluster, Counter(reason for reason, _ in plan.waits.values())


def _profile(scheduler: Scheduler, label: str, lines: int) -> str:
    profiler = cProfile.Profile()
    profiler.enable()
    scheduler.tick()
    profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("cumulative").print_stats(lines)
    stats.sort_stats("tottime").print_stats(lines)
    return f"--- cProfile, one tick of {label} ---\n{out.getvalue()}"


def drop_database(url: str) -> None:
    parsed = make_url(url)
    admin = parsed.set(drivername="postgresql", database="postgres").render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{parsed.database}" WITH (FORCE)')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url", nargs="?", default=DEFAULT_URL)
    parser.add_argument("--seed", action="store_true", help="drop, create and seed the database first")
    parser.add_argument("--keep", action="store_true", help="keep the database a --seed run created (default: drop)")
    parser.add_argument("--rounds", type=int, default=10, help="rounds, alternating which arm goes first")
    parser.add_argument("--ticks", type=int, default=10, help="timed ticks per arm and round")
    parser.add_argument("--profile", action="store_true", help="cProfile one tick of each arm at the end")
    args = parser.parse_args()

    if args.seed:
        seed_fresh(args.url)

    engine = make_engine(args.url)
    sessions = make_session_factory(engine)
    try:
        result = _run(sessions, args.url, args)
    finally:
        try:
            _switch(sessions, "one", _layout(sessions))  # the database as it was (but for the default's row)
        finally:
            engine.dispose()
            if args.seed and not args.keep:
                drop_database(args.url)
                print(f"dropped {make_url(args.url).database}")
    print(json.dumps(result))


def _run(sessions, url: str, args) -> dict:
    settings = Settings(database_url=url)
    with sessions.begin() as session:  # as the service does on every start
        clusters_repo.ensure_default_cluster(session, DEFAULT, "http://local:8265", None)
    with sessions() as session:
        states = dict(session.execute(select(Job.state, func.count()).group_by(Job.state)).all())
    queued = states.get("QUEUED", 0)
    layout = _layout(sessions)
    largest = _largest_queued_cpus(sessions)

    # Each arm's stand-ins: the running jobs on a cluster hold all its CPUs, so every queued job waits.
    _switch(sessions, "three", layout)
    held_three = _held(sessions)
    _switch(sessions, "one", layout)
    held_one = _held(sessions)
    for name in (DEFAULT, *OTHERS):
        if held_three.get(name, 0.0) < largest:  # else a run could never fit there, and would be failed
            raise SystemExit(f"cluster {name} would hold {held_three.get(name, 0.0)} CPUs < {largest}")
    one = Scheduler(sessions, IdleCluster(cpus=max(held_one[DEFAULT], 1.0)), settings)
    stand_ins = {OTHERS[n][0]: IdleCluster(cpus=held_three[n]) for n in OTHERS}
    registry = ClusterBackends(sessions, connect=lambda address, token: stand_ins[address])
    registry.set_default(DEFAULT, IdleCluster(cpus=held_three[DEFAULT]))
    three = Scheduler(sessions, registry, settings)
    schedulers = {"one": one, "three": three}
    print(f"jobs by state: {states}")
    print(f"CPUs held: one {held_one}; three {held_three} (largest queued job {largest:g} CPUs)")
    print(
        "bindings (three): "
        + ", ".join(f"{'+'.join(b) or '(none: default)'} x{n}" for b, n in Counter(layout["bound"].values()).items())
        + f"; running jobs on {dict(Counter(layout['on'].values()))}",
        flush=True,
    )

    loaded: list[str] = []

    def on_load(job, _context):
        loaded.append(job.state)

    wall: dict[str, list[float]] = {"one": [], "three": []}
    cpu: dict[str, list[float]] = {"one": [], "three": []}
    jobs_loaded: dict[str, list[int]] = {"one": [], "three": []}
    ended_loaded = Counter()
    placement: dict = {}
    current = "one"
    started = time.monotonic()
    event.listen(Job, "load", on_load)
    try:
        for round_ in range(args.rounds):
            for arm in ("one", "three") if round_ % 2 == 0 else ("three", "one"):
                if arm != current:
                    _switch(sessions, arm, layout)
                    current = arm
                scheduler = schedulers[arm]
                if arm == "three" and not placement:
                    per_cluster, reasons = _placed_once(scheduler, queued)  # untimed, as every block's first tick
                    placement = {"queued_per_cluster": dict(per_cluster), "reasons": dict(reasons)}
                else:
                    _check(scheduler.tick(), queued, arm)  # notes the reasons that changed with the switch
                for _ in range(args.ticks):
                    loaded.clear()
                    t0, c0 = time.perf_counter(), time.process_time()
                    plan = scheduler.tick()
                    wall[arm].append((time.perf_counter() - t0) * 1000)
                    cpu[arm].append((time.process_time() - c0) * 1000)
                    _check(plan, queued, arm)
                    jobs_loaded[arm].append(len(loaded))
                    ended_loaded[arm] += sum(1 for state in loaded if state in TERMINAL)
            print(
                f"round {round_ + 1}/{args.rounds} ({time.monotonic() - started:.0f} s): median ms so far "
                f"one {statistics.median(wall['one']):.1f}, three {statistics.median(wall['three']):.1f}",
                flush=True,
            )
        profiles = ""
        med = {arm: statistics.median(v) for arm, v in wall.items()}
        med_cpu = {arm: statistics.median(v) for arm, v in cpu.items()}
        ratio, ratio_cpu = med["three"] / med["one"], med_cpu["three"] / med_cpu["one"]
        if args.profile or ratio > GOAL:
            for arm in (current, "three" if current == "one" else "one"):
                if arm != current:
                    _switch(sessions, arm, layout)
                    current = arm
                    schedulers[arm].tick()
                profiles += _profile(schedulers[arm], arm, 30)
    finally:
        event.remove(Job, "load", on_load)

    with sessions() as session:
        after = dict(session.execute(select(Job.state, func.count()).group_by(Job.state)).all())
    if after != states:
        raise SystemExit(f"the jobs' states changed: {states} -> {after}")
    print(f"placement (three, one tick): {placement}")
    for arm in ("one", "three"):
        print(
            f"{arm:>5}: {len(wall[arm])} ticks, wall median {med[arm]:.1f} ms (min {min(wall[arm]):.1f}, max "
            f"{max(wall[arm]):.1f}), this process's CPU median {med_cpu[arm]:.1f} ms; jobs loaded per tick "
            f"{statistics.median(jobs_loaded[arm]):g}, ended jobs loaded {ended_loaded[arm]}"
        )
    print(
        f"ratio three / one: wall {ratio:.2f}, CPU {ratio_cpu:.2f} "
        f"(goal <= {GOAL}: {'met' if ratio <= GOAL else 'NOT met'})"
    )
    if profiles:
        print(profiles)
    return {
        "wall_ms": wall,
        "cpu_ms": cpu,
        "median_ms": med,
        "median_cpu_ms": med_cpu,
        "ratio": ratio,
        "ratio_cpu": ratio_cpu,
        "placement": placement,
    }


if __name__ == "__main__":
    main()
