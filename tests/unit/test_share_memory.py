"""Fair share's memory survives a restart (docs/scheduling.md, "The order, each tick"): a new leader seeds each
project's decayed dominant share from the usage ledger (``orchestrator.scheduling.share_memory``) and orders projects as
the leader that kept running would, instead of starting from what each project holds at that moment."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest

from orchestrator.db.models import UsageInterval, utcnow
from orchestrator.scheduling.policy import decayed_shares, dominant_share
from orchestrator.scheduling.share_memory import ledger_shares
from tests.unit.api_helpers import auth, make_project, submit
from tests.unit.test_quotas import scheduler

T0 = datetime(2026, 11, 27, 8, 0, tzinfo=UTC)
CAPACITY = {"CPU": 8.0, "GPU": 2.0}
HALF_LIFE_S = 600.0


def stretch(project: str, start_s: float, end_s: float | None, workers: int = 1, cpus: float = 1, gpus: float = 0):
    end = None if end_s is None else T0 + timedelta(seconds=end_s)
    return SimpleNamespace(
        project_id=project,
        workers=workers,
        cpus=cpus,
        gpus=gpus,
        started_at=T0 + timedelta(seconds=start_s),
        ended_at=end,
    )


# Over an hour of three projects: a held both GPUs until 400 s before the restart; b ran small CPU jobs (2 CPUs,
# 7 minutes in every 10) and now also a 1-CPU one; c started a 4-CPU job 10 minutes before and still holds it.
HISTORY = [
    stretch("a", 0, 900, workers=1, cpus=2),
    stretch("a", 1200, 3600, workers=2, cpus=1, gpus=1),
    *[stretch("b", 600 * i, 600 * i + 420, workers=2, cpus=1) for i in range(7)],
    stretch("b", 3900, None, workers=1, cpus=1),
    stretch("c", 3400, None, workers=4, cpus=1),
]
RESTART_S = 4000


def continuing_leader(history, until_s: float, tick_s: float) -> dict[str, float]:
    """What a leader that ticked every ``tick_s`` through the whole history holds at ``until_s``."""
    shares = None
    for step in range(int(until_s / tick_s) + 1):
        at = step * tick_s
        held: dict[str, dict[str, float]] = {}
        for s in history:
            start = (s.started_at - T0).total_seconds()
            end = (s.ended_at - T0).total_seconds() if s.ended_at else float("inf")
            if start <= at < end:
                bucket = held.setdefault(s.project_id, {"CPU": 0.0, "GPU": 0.0})
                bucket["CPU"] += s.workers * s.cpus
                bucket["GPU"] += s.workers * s.gpus
        current = {p: dominant_share(r, CAPACITY) for p, r in held.items()}
        shares = decayed_shares(shares, tick_s if shares is not None else 0.0, current, HALF_LIFE_S)
    return shares


@pytest.mark.parametrize("tick_s", [1.0, 5.0])
def test_the_ledger_gives_the_shares_a_continuing_leader_holds(tick_s):
    kept = continuing_leader(HISTORY, RESTART_S, tick_s)
    seeded = ledger_shares(HISTORY, CAPACITY, T0 + timedelta(seconds=RESTART_S), HALF_LIFE_S)
    assert seeded.keys() == kept.keys() == {"a", "b", "c"}
    for project in kept:  # within what changes between two ticks (a share decays 0.6 % in 5 s)
        assert seeded[project] == pytest.approx(kept[project], rel=0.01), (project, seeded, kept)
    # a's GPUs, 400 s ago: 0.63; b holds 3 of 8 CPUs now, c 4: a goes last, as the continuing leader has it
    # (from what each holds now alone, a, holding nothing, would go first).
    assert seeded["a"] == pytest.approx(0.5 ** (400 / HALF_LIFE_S))
    assert sorted(seeded, key=seeded.get) == sorted(kept, key=kept.get) == ["b", "c", "a"]


def test_only_the_last_few_half_lives_count_and_no_half_life_means_no_memory():
    now = T0 + timedelta(seconds=RESTART_S)
    old = [stretch("a", 0, 600, workers=8)]  # the whole cluster, 3400 s ago: past 5 half-lives
    assert ledger_shares(old, CAPACITY, now, HALF_LIFE_S) == {}
    assert ledger_shares(HISTORY, CAPACITY, now, 0) == {}
    recent = [stretch("a", 3000, 3400, workers=8)]  # the whole cluster until 10 minutes ago: half of it
    assert ledger_shares(recent, CAPACITY, now, HALF_LIFE_S) == pytest.approx({"a": 0.5})


def test_a_restarted_scheduler_orders_projects_from_the_ledger(app, client, backend):
    """Project a filled the 4-CPU cluster until 5 minutes ago (the ledger says so); b holds 1 CPU now, c 2; one
    CPU is free and a and b each queue a 1-CPU job, a's first. A leader that kept running remembers a's share
    (1.0 halved over 5 of its 10-minute half-life: 0.71) above b's 0.25 and starts b's job; a new leader (a
    fresh Scheduler) seeds the same shares from the ledger at its first tick and starts b's job too."""
    backend.total = {"CPU": 4.0, "GPU": 0.0}
    (a, keys_a), (b, keys_b), (c, keys_c) = (make_project(client, name) for name in ("a", "b", "c"))
    submit(client, keys_b["member"], scaling={"num_workers": 1, "cpus_per_worker": 1})
    submit(client, keys_c["member"], scaling={"num_workers": 2, "cpus_per_worker": 1})
    scheduler(app).tick()  # both admitted: 3 of 4 CPUs held
    now = utcnow()
    with app.state.service.sessions.begin() as session:
        session.add(
            UsageInterval(
                project_id=a,
                kind="job",
                subject_id="gone",
                attempt=1,
                workers=4,
                cpus=1.0,
                gpus=0.0,
                memory_gb=16.0,
                started_at=now - timedelta(minutes=25),
                ended_at=now - timedelta(minutes=5),
                end_state="SUCCEEDED",
                end_reason="completed",
            )
        )
    job_a = submit(client, keys_a["member"], scaling={"num_workers": 1, "cpus_per_worker": 1}).json()["id"]
    job_b = submit(client, keys_b["member"], scaling={"num_workers": 1, "cpus_per_worker": 1}).json()["id"]

    fresh = scheduler(app)
    plan = fresh.tick(now=now)
    assert plan.admit == [(f"job:{job_b}", False)], plan
    half_life_s = app.state.service.settings.fair_share_half_life_s
    kept = decayed_shares({a: 1.0, b: 0.25, c: 0.5}, 300, {b: 0.25, c: 0.5}, half_life_s)
    assert fresh.shares == pytest.approx(kept, rel=0.01) and kept[a] > kept[b]
    assert client.get(f"/v1/jobs/{job_a}", headers=auth(keys_a["member"])).json()["state"] == "QUEUED"
