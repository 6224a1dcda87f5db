"""The scheduling policy (docs/scheduling.md) as pure functions: fair-share order, quotas (GPUs, fractional CPUs,
running jobs), borrowing, the starvation guard and when to preempt. No database, no Ray: plain data in, a plan out."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from orchestrator.admission import ClusterCapacity, Demand
from orchestrator.scheduling.policy import (
    Holding,
    ProjectQuota,
    Waiting,
    decayed_shares,
    dominant_share,
    never_fits_quota,
    over_quota,
    plan_tick,
)

NOW = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
STARVATION_S = 1800.0


def cluster(cpus: float = 4, gpus: float = 0, largest: dict | None = None) -> ClusterCapacity:
    total = {"CPU": float(cpus), "GPU": float(gpus)}
    return ClusterCapacity(total=total, largest_node=largest or dict(total))


def demand(cpus: float = 1, gpus: float = 0, workers: int = 1) -> Demand:
    return Demand(
        total={"CPU": cpus * workers, "GPU": gpus * workers},
        per_worker={"CPU": cpus, "GPU": gpus},
        what=f"{workers} workers",
    )


def waiting(key: str, project: str, cpus: float = 1, gpus: float = 0, workers: int = 1, priority: int = 0, age_s=0):
    return Waiting(key, project, priority, NOW - timedelta(seconds=age_s), demand(cpus, gpus, workers))


def held(key: str, project: str, cpus: float = 1, gpus: float = 0, priority: int = 0, borrowing=False, age_s=60):
    return Holding(
        key, project, {"CPU": cpus, "GPU": gpus}, priority, NOW - timedelta(seconds=age_s), borrowing=borrowing
    )


def plan(queued, holding=(), quotas=(), capacity=None, shares=None, starvation_s=STARVATION_S):
    return plan_tick(
        list(queued),
        list(holding),
        {q.id: q for q in quotas},
        capacity or cluster(),
        shares if shares is not None else {},
        NOW,
        starvation_s,
    )


def admitted(result) -> list[str]:
    return [key for key, _ in result.admit]


# --- fair share -----------------------------------------------------------------------------------------


def test_fair_share_interleaves_projects_instead_of_draining_the_first():
    """Project a queued 4 jobs before b queued any: with one queue for the service a would take all 4 CPUs;
    by fair share each project gets 2."""
    queued = [waiting(f"a{i}", "a", age_s=100 - i) for i in range(4)] + [
        waiting(f"b{i}", "b", age_s=50 - i) for i in range(4)
    ]
    result = plan(queued)
    assert sorted(admitted(result)) == ["a0", "a1", "b0", "b1"]
    assert result.waits["a2"][0] == "insufficient_resources"


def test_the_project_with_the_smaller_share_goes_first():
    """b already holds 2 of 4 CPUs; a holds none: a's jobs start first, b gets what is left."""
    queued = [waiting("b-new", "b", age_s=500), waiting("a1", "a", age_s=10), waiting("a2", "a", age_s=5)]
    result = plan(queued, holding=[held("b-old", "b", cpus=2)], shares={"b": 0.5})
    assert admitted(result) == ["a1", "a2"]
    assert result.waits["b-new"] == ("insufficient_resources", "waiting for resources: needs 1 CPU, 0 free")


def test_weights_scale_the_share():
    """a has weight 3, b weight 1, both hold nothing: a gets 3 of the 4 CPUs, b one."""
    queued = [waiting(f"a{i}", "a", age_s=100 - i) for i in range(4)] + [
        waiting(f"b{i}", "b", age_s=50 - i) for i in range(4)
    ]
    result = plan(queued, quotas=[ProjectQuota("a", weight=3), ProjectQuota("b", weight=1)])
    assert sorted(admitted(result)) == ["a0", "a1", "a2", "b0"]


def test_the_decayed_share_remembers_recent_use():
    """a ran the cluster full for a while and just stopped; b did not: b goes first although a's job is older."""
    shares = decayed_shares({"a": 1.0}, elapsed_s=60, current={}, half_life_s=600)
    assert shares["a"] == pytest.approx(0.5 ** (60 / 600))
    result = plan([waiting("a1", "a", cpus=4, age_s=100), waiting("b1", "b", cpus=4, age_s=10)], shares=shares)
    assert admitted(result) == ["b1"]


def test_decayed_shares_halve_every_half_life_and_start_from_what_is_held():
    assert decayed_shares(None, 0, {"a": 0.5}, 600) == {"a": 0.5}  # no history: what it holds now
    assert decayed_shares({"a": 1.0}, 600, {"a": 0.0}, 600) == {"a": pytest.approx(0.5)}
    assert decayed_shares({"a": 1.0}, 1200, {}, 600) == {"a": pytest.approx(0.25)}
    assert decayed_shares({"a": 1.0}, 5, {"b": 0.4}, 0) == {"b": 0.4}  # half-life 0: no memory
    # What a project takes counts at once; what it gave back fades.
    assert decayed_shares({}, 1, {"a": 1.0}, 600) == {"a": 1.0}
    assert decayed_shares({"a": 0.9}, 600, {"a": 0.2}, 600) == {"a": pytest.approx(0.45)}
    assert decayed_shares({"a": 0.9}, 600, {"a": 0.6}, 600) == {"a": 0.6}


def test_dominant_share_is_the_larger_of_cpu_and_gpu_fractions():
    assert dominant_share({"CPU": 1, "GPU": 2}, {"CPU": 16, "GPU": 8}) == pytest.approx(0.25)
    assert dominant_share({"CPU": 8, "GPU": 0}, {"CPU": 16, "GPU": 8}) == pytest.approx(0.5)
    assert dominant_share({"CPU": 1, "GPU": 0}, {"CPU": 4, "GPU": 0}) == pytest.approx(0.25)  # no GPUs: skipped


def test_within_a_project_priority_then_age():
    queued = [
        waiting("old-low", "a", priority=0, age_s=300),
        waiting("new-high", "a", priority=5, age_s=10),
        waiting("mid", "a", priority=5, age_s=20),
    ]
    result = plan(queued, capacity=cluster(cpus=2))
    assert admitted(result) == ["mid", "new-high"]
    assert result.waits["old-low"][0] == "insufficient_resources"


def test_a_small_job_passes_a_big_one_only_while_the_big_one_cannot_fit():
    big, small = waiting("big", "a", cpus=4, age_s=100), waiting("small", "a", cpus=1, age_s=10)
    # 2 CPUs free: the big one cannot fit, the small one passes it.
    result = plan([big, small], holding=[held("x", "b", cpus=2)])
    assert admitted(result) == ["small"]
    # The cluster is idle: the big one fits and goes first; the small one waits for it.
    result = plan([big, small])
    assert admitted(result) == ["big"]
    assert result.waits["small"][0] == "insufficient_resources"


# --- the starvation guard -------------------------------------------------------------------------------


def test_a_starved_big_job_gets_a_reservation_and_small_ones_stop_passing_it():
    """Small jobs keep 1 of 4 CPUs busy, so a 4-CPU job never finds room and they keep passing it. After
    starvation_s it goes first and holds what is free: a small one no longer starts on those CPUs."""
    holding = [held("s-running", "a", cpus=1)]
    queued = [waiting("big", "a", cpus=4, age_s=STARVATION_S - 1), waiting("small", "a", cpus=1, age_s=5)]
    before = plan(queued, holding=holding)
    assert admitted(before) == ["small"] and before.reserved_for is None

    queued = [waiting("big", "a", cpus=4, age_s=STARVATION_S), waiting("small", "a", cpus=1, age_s=5)]
    after = plan(queued, holding=holding)
    assert admitted(after) == [] and after.reserved_for == "big"
    assert after.waits["big"] == (
        "insufficient_resources",
        "waiting for resources: needs 4 CPU, 3 free (waited past the starvation guard: resources are held for it)",
    )
    assert after.waits["small"] == ("insufficient_resources", "waiting for resources: needs 1 CPU, 0 free")
    # Once the running small job ends, the big one starts.
    assert admitted(plan(queued)) == ["big"]


def test_the_reservation_holds_only_what_the_starved_job_needs():
    """A starved 2-GPU job holds the 1 free GPU; a CPU-only job still starts on CPUs it does not need."""
    capacity = cluster(cpus=8, gpus=2)
    holding = [held("g", "b", cpus=1, gpus=1)]
    queued = [waiting("gpu-big", "a", cpus=1, gpus=1, workers=2, age_s=STARVATION_S + 5), waiting("cpu", "a", cpus=2)]
    result = plan(queued, holding=holding, capacity=capacity)
    assert result.reserved_for == "gpu-big"
    assert admitted(result) == ["cpu"]
    queued.append(waiting("gpu-small", "a", cpus=1, gpus=1, age_s=1))
    result = plan(queued, holding=holding, capacity=capacity)
    assert "gpu-small" not in admitted(result) and result.waits["gpu-small"][0] == "insufficient_resources"


def test_starved_jobs_go_first_oldest_first_across_projects():
    """b holds less, so fair share would pick b, but a's job has waited past the guard."""
    queued = [waiting("a-old", "a", cpus=2, age_s=STARVATION_S * 2), waiting("b-new", "b", cpus=2, age_s=5)]
    result = plan(queued, holding=[held("a-run", "a", cpus=2)], shares={"a": 0.5})
    assert admitted(result) == ["a-old"]


def test_a_requeued_run_counts_its_wait_from_its_requeue_not_its_submit():
    """A job submitted two hours ago, preempted and requeued a minute ago, has waited a minute: a job queued
    40 minutes ago is the starved one that holds the reservation, not the requeued one."""
    holding = [held("s-running", "a", cpus=1)]
    requeued = Waiting(
        "requeued", "a", 0, NOW - timedelta(hours=2), demand(cpus=4), queued_at=NOW - timedelta(minutes=1)
    )
    old = waiting("old", "b", cpus=4, age_s=40 * 60)
    result = plan([requeued, old], holding=holding)
    assert result.reserved_for == "old" and "starvation guard" not in result.waits["requeued"][1]
    assert requeued.waiting_since == NOW - timedelta(minutes=1) and old.waiting_since == old.created_at
    # Alone, it is not starved either: nothing is held back, a small job still passes it.
    alone = plan([requeued, waiting("small", "a", cpus=1)], holding=holding)
    assert alone.reserved_for is None and admitted(alone) == ["small"]
    # Once it has waited starvation_s since its requeue, it is.
    later = Waiting("requeued", "a", 0, requeued.created_at, demand(cpus=4), queued_at=NOW - timedelta(hours=1))
    assert plan([later, waiting("small", "a", cpus=1)], holding=holding).reserved_for == "requeued"


# --- quotas ---------------------------------------------------------------------------------------------


def test_quota_gpus_message_names_use_limit_and_need():
    vision = ProjectQuota("p1", name="vision", max_gpus=8, borrowing=False)
    assert over_quota(vision, {"CPU": 6, "GPU": 6}, {"CPU": 4, "GPU": 4}) == (
        "GPU",
        "project vision uses 6 of 8 GPUs; this job needs 4",
    )
    assert over_quota(vision, {"GPU": 4}, {"GPU": 4}) is None  # exactly at the limit fits
    capacity = cluster(cpus=64, gpus=16)
    holding = [held("v1", "p1", cpus=6, gpus=6)]
    result = plan([waiting("v2", "p1", cpus=1, gpus=1, workers=4)], holding, [vision], capacity)
    assert result.waits["v2"] == (
        "quota_exceeded",
        "project vision uses 6 of 8 GPUs; this job needs 4 (borrowing is off)",
    )


def test_fractional_cpu_quota_arithmetic():
    """Quota 1.5 CPUs: three 0.5-CPU jobs fit, a fourth does not (no float drift past the limit)."""
    quota = ProjectQuota("a", max_cpus=1.5, borrowing=False)
    queued = [waiting(f"j{i}", "a", cpus=0.5, age_s=10 - i) for i in range(4)]
    result = plan(queued, quotas=[quota])
    assert admitted(result) == ["j0", "j1", "j2"]
    assert result.waits["j3"] == (
        "quota_exceeded",
        "project a uses 1.5 of 1.5 CPUs; this job needs 0.5 (borrowing is off)",
    )
    # 0.1 x 3 is 0.30000000000000004 in floats: still within a 0.3 quota.
    tenth = ProjectQuota("t", max_cpus=0.3, borrowing=False)
    assert admitted(plan([waiting(f"t{i}", "t", cpus=0.1, age_s=5 - i) for i in range(3)], quotas=[tenth])) == [
        "t0",
        "t1",
        "t2",
    ]


def test_max_running_jobs_counts_runs_not_resources_and_is_never_borrowed():
    quota = ProjectQuota("a", max_running_jobs=1, borrowing=True)
    result = plan([waiting("j2", "a", cpus=0.1)], holding=[held("j1", "a", cpus=0.1)], quotas=[quota])
    assert admitted(result) == []
    assert result.waits["j2"] == ("quota_exceeded", "project a runs 1 of 1 jobs at once (max_running_jobs)")


def test_deployment_replicas_count_against_the_cpu_quota_but_not_running_jobs():
    quota = ProjectQuota("a", max_cpus=2, max_running_jobs=1, borrowing=False)
    replicas = Holding("deployment:d", "a", {"CPU": 1.5, "GPU": 0}, is_run=False, preemptible=False)
    result = plan([waiting("j", "a", cpus=1)], holding=[replicas], quotas=[quota])
    assert result.waits["j"] == ("quota_exceeded", "project a uses 1.5 of 2 CPUs; this job needs 1 (borrowing is off)")
    assert admitted(plan([waiting("j", "a", cpus=0.5)], holding=[replicas], quotas=[quota])) == ["j"]


def test_never_fits_quota_says_what_to_change():
    strict = ProjectQuota("p", name="vision", max_gpus=2, borrowing=False)
    message = never_fits_quota(strict, demand(cpus=1, gpus=1, workers=4))
    assert message == (
        "needs 4 GPU for 4 workers but project vision's quota is 2 GPUs (max_gpus) and it may not borrow: ask for "
        "less, or ask a cluster-wide admin to raise the quota (PUT /v1/projects/{id}/quota)"
    )
    assert never_fits_quota(strict, demand(cpus=1, gpus=1, workers=2)) is None
    # A project that may borrow can run it on idle capacity: accepted.
    assert never_fits_quota(ProjectQuota("p", max_gpus=2, borrowing=True), demand(gpus=1, workers=4)) is None
    assert "max_running_jobs is 0" in never_fits_quota(ProjectQuota("p", max_running_jobs=0), demand())
    # A run that may not be preempted never borrows: the quota binds it even where the project may borrow.
    exempt = never_fits_quota(ProjectQuota("p", name="vision", max_gpus=2), demand(gpus=1, workers=4), False)
    assert exempt is not None and exempt.startswith("needs 4 GPU for 4 workers but project vision's quota is 2 GPUs")
    assert "a run that may not be preempted never borrows beyond its project's quota: ask for less" in exempt


# --- borrowing ------------------------------------------------------------------------------------------


def test_borrowing_uses_idle_capacity_after_everyone_within_quota_and_is_marked():
    """a (quota 1 CPU, may borrow) and b (quota 2 CPUs) on 4 CPUs: within-quota runs go first, then a borrows
    what is left; the borrowed run is marked so preemption takes it first."""
    quotas = [ProjectQuota("a", max_cpus=1), ProjectQuota("b", max_cpus=2)]
    queued = [waiting(f"a{i}", "a", age_s=100 - i) for i in range(3)] + [
        waiting(f"b{i}", "b", age_s=50 - i) for i in range(3)
    ]
    result = plan(queued, quotas=quotas)
    assert result.admit == [("a0", False), ("b0", False), ("b1", False), ("a1", True)]
    assert result.waits["b2"] == (
        "quota_exceeded",
        "project b uses 2 of 2 CPUs; this job needs 1; no idle capacity to borrow: needs 1 CPU, 0 free",
    )
    assert result.waits["a2"] == (
        "quota_exceeded",
        "project a uses 2 of 1 CPUs; this job needs 1; no idle capacity to borrow: needs 1 CPU, 0 free",
    )


def test_a_run_that_may_not_be_preempted_never_borrows():
    """Borrowed capacity is taken back by preemption, which such a run refuses: it waits within its quota while
    the project's preemptible runs still borrow (docs/scheduling.md, "The order, each tick", step 6)."""
    quotas = [ProjectQuota("a", name="vision", max_cpus=1)]
    exempt = Waiting("a-exempt", "a", 0, NOW - timedelta(seconds=5), demand(), preemptible=False)
    result = plan([waiting("a0", "a", age_s=10), exempt, waiting("a1", "a", age_s=1)], quotas=quotas)
    assert result.admit == [("a0", False), ("a1", True)]
    assert result.waits["a-exempt"] == (
        "quota_exceeded",
        "project vision uses 1 of 1 CPUs; this job needs 1 "
        "(a run that may not be preempted never borrows beyond its project's quota)",
    )


def test_borrowing_off_keeps_a_project_within_its_quota_on_an_idle_cluster():
    quotas = [ProjectQuota("a", max_cpus=1, borrowing=False)]
    result = plan([waiting("a0", "a", age_s=2), waiting("a1", "a", age_s=1)], quotas=quotas)
    assert admitted(result) == ["a0"]
    assert result.waits["a1"] == ("quota_exceeded", "project a uses 1 of 1 CPUs; this job needs 1 (borrowing is off)")


# --- when to preempt ------------------------------------------------------------------------------------


def test_a_higher_priority_job_asks_to_preempt_a_lower_priority_one_of_its_project():
    holding = [held("low", "a", cpus=2, priority=0, age_s=600), held("low-young", "a", cpus=2, priority=0, age_s=60)]
    result = plan([waiting("urgent", "a", cpus=2, priority=10)], holding=holding)
    assert result.preemption is not None
    assert result.preemption.for_key == "urgent" and result.preemption.victims == ("low-young",)  # youngest
    assert result.preemption.trigger_of == {"low": "priority", "low-young": "priority"}
    # Equal priority: no preemption.
    assert plan([waiting("same", "a", cpus=2, priority=0)], holding=holding).preemption is None


def test_a_project_within_quota_takes_back_capacity_from_a_borrower():
    quotas = [ProjectQuota("a", max_cpus=2), ProjectQuota("b", max_cpus=2)]
    holding = [held("b1", "b", cpus=2), held("b-borrow", "b", cpus=2, borrowing=True)]
    result = plan([waiting("a1", "a", cpus=2)], holding=holding, quotas=quotas, shares={"b": 1.0})
    assert result.preemption is not None and result.preemption.victims == ("b-borrow",)
    assert result.preemption.trigger_of["b-borrow"] == "quota"


def test_a_project_under_its_fair_share_preempts_one_above_it():
    """b holds the whole cluster; a (equal weight) wants half: b is above its share, a below."""
    holding = [held("b1", "b", cpus=2, age_s=100), held("b2", "b", cpus=2, age_s=50)]
    result = plan([waiting("a1", "a", cpus=2)], holding=holding, shares={"b": 1.0})
    assert result.preemption is not None and result.preemption.victims == ("b2",)
    assert result.preemption.trigger_of == {"b1": "fair_share", "b2": "fair_share"}
    # a asking for more than its half would take it above its own share: no preemption.
    assert plan([waiting("a-big", "a", cpus=3)], holding=holding, shares={"b": 1.0}).preemption is None


def test_a_higher_priority_job_over_its_quota_preempts_its_projects_lower_priority_job():
    """The project's quota is full of its own low-priority work: the urgent job takes the quota back from it
    (the cluster has room: the quota is what it lacks), and choose_victims sees the quota's headroom as free."""
    quotas = [ProjectQuota("a", max_cpus=1, borrowing=False)]
    holding = [held("a-low", "a", cpus=1, priority=0)]
    result = plan([waiting("a-high", "a", cpus=1, priority=5)], holding, quotas)
    assert result.waits["a-high"][0] == "quota_exceeded"
    assert result.preemption is not None and result.preemption.victims == ("a-low",)
    assert result.preemption.free == {"CPU": 0.0, "GPU": 0.0}  # 3 CPUs free in the cluster, none in the quota
    # max_running_jobs: one of its own runs must go, whatever it holds.
    count = [ProjectQuota("a", max_running_jobs=1)]
    result = plan([waiting("a-high", "a", cpus=1, priority=5)], [held("a-low", "a", cpus=0.5)], count)
    assert result.preemption is not None and result.preemption.victims == ("a-low",)


def test_no_preemption_when_victims_cannot_free_enough_or_only_other_projects_hold_the_quota():
    # Over its own quota, another project's borrower or over-share run gives it no quota back.
    quotas = [ProjectQuota("a", max_cpus=1, borrowing=False)]
    holding = [held("a-run", "a", cpus=1, priority=9), held("b-borrow", "b", cpus=3, borrowing=True)]
    assert plan([waiting("a-high", "a", cpus=1, priority=5)], holding, quotas).preemption is None
    # Equal priority in its project: no trigger.
    assert plan([waiting("a-same", "a", cpus=1, priority=9)], holding, quotas).preemption is None
    not_preemptible = [Holding("x", "a", {"CPU": 4, "GPU": 0}, priority=0, preemptible=False)]
    assert plan([waiting("a-high", "a", cpus=2, priority=5)], not_preemptible).preemption is None
    # Victims that together free too little: nobody is asked.
    small = [held("a-low", "a", cpus=1, priority=0), held("b-x", "b", cpus=3, priority=9)]
    assert plan([waiting("a-high", "a", cpus=3, priority=5)], small, shares={"a": 0.25, "b": 0.75}).preemption is None


def test_a_run_that_may_not_be_preempted_is_never_named_and_leaves_the_turn_to_the_next_run():
    """One preemption a tick: a plan naming only a non-preemptible borrower (which choose_victims refuses) would
    take every tick's turn. d's run (first in fair-share order) has no victim; a's urgent job gets the turn."""
    holding = [
        held("a-low", "a", cpus=1, priority=0),
        Holding("b-exempt", "b", {"CPU": 1, "GPU": 0}, 0, NOW, borrowing=True, preemptible=False),
    ]
    queued = [waiting("d1", "d", cpus=1), waiting("a-urgent", "a", cpus=1, priority=10)]
    result = plan(queued, holding, capacity=cluster(cpus=2), shares={"a": 0.5, "b": 0.5})
    assert result.preemption is not None and result.preemption.for_key == "a-urgent"
    assert result.preemption.victims == ("a-low",) and "b-exempt" not in result.preemption.trigger_of


def test_a_run_that_can_never_fit_the_cluster_fails():
    result = plan([waiting("huge", "a", cpus=8)], capacity=cluster(cpus=4))
    assert result.fail == {"huge": "needs 8 CPU for 1 workers but the whole cluster has 4 CPU"}
