"""The scheduling policy (docs/scheduling.md) as pure functions over plain data: which queued runs start this tick, why
the others wait, and whether a run that cannot start otherwise justifies a preemption. No database, no Ray:
``orchestrator.loops.scheduler`` loads the data, calls ``plan_tick`` and carries the plan out.

The rules (docs/scheduling.md):

1. A run that could never fit the cluster fails (``insufficient_resources``), as before.
2. Starvation guard: a run that has waited ``starvation_s`` or more since it last entered QUEUED (its submit, or
   its requeue after a preemption) goes first, longest waiting first, and the first of
   those that does not fit gets a reservation: what it needs is held back from every run considered after
   it, so smaller runs may start only on what it does not need, and it starts as soon as enough is free.
3. Between projects, weighted fair share: the project with the smallest dominant share (the larger of its
   CPU and GPU fraction of the cluster, decayed over a window: ``decayed_shares``) divided by its weight
   goes next; its share grows with each run it starts this tick. Within a project, priority then age.
4. Quota: a run that would take its project past ``max_running_jobs`` waits (``quota_exceeded``); one that
   would take it past ``max_cpus``/``max_gpus`` waits too, unless the project may borrow: then it may start
   on what is left once every project's runs within quota have had their turn, and it is marked borrowing. A run
   that may not be preempted never borrows: it waits within its quota (nothing could take the capacity back).
5. A run that fits what is free starts; one that does not waits (``insufficient_resources``) while smaller
   ones behind it may still start (only on what a reservation does not hold).
6. Preemption: the first run (in the order above) that preempting would let start asks for victims: runs
   of its project with a lower priority (also for a run over its project's quota: they give the quota back);
   for a run waiting for the cluster, also runs of other projects that borrow, and runs of projects above
   their fair share while its project, with it, stays at or below its own. One preemption a tick, so a run
   that may not be preempted (``Holding.preemptible`` False) is never counted as a victim: a plan that named
   it would be refused and would take the tick's one turn from every other waiting run.

Deployments (``Waiting.is_run`` False: a new version's replicas, beyond what the deployment holds now) wait
in their project's queue as runs of priority 0 do, under the same quota and borrowing rules, but count against
no ``max_running_jobs``, are never failed for the cluster (they wait for nodes) and never preempt.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime

from orchestrator.admission import RESOURCES, ClusterCapacity, Demand, free_of, never_fits, reserved_by, shortfall

_EPS = 1e-9
QUOTA_EXCEEDED = "quota_exceeded"
INSUFFICIENT = "insufficient_resources"
_UNITS = {"CPU": "CPUs", "GPU": "GPUs"}
# A project's borrowing lets its runs use idle capacity past its quota because preemption takes that capacity
# back when its owner needs it; a deployment is never preempted, so it stays within its project's quota.
DEPLOYMENTS_DO_NOT_BORROW = "a deployment never borrows beyond its project's quota"
# The same for a run whose spec says ``preemptible: false`` (docs/security.md): capacity it borrowed could never be taken
# back, and as a victim it could only be refused.
NON_PREEMPTIBLE_DO_NOT_BORROW = "a run that may not be preempted never borrows beyond its project's quota"
_LIMITS = {"CPU": "max_cpus", "GPU": "max_gpus"}


@dataclass(frozen=True)
class ProjectQuota:
    """A project's quota and fair-share weight; None: no limit."""

    id: str
    name: str = ""
    max_cpus: float | None = None
    max_gpus: float | None = None
    max_running_jobs: int | None = None
    max_queued: int | None = None
    weight: float = 1.0
    borrowing: bool = True
    # Caps on single clusters: {cluster: {"max_cpus", "max_gpus", "max_running_jobs"}} (docs/clusters.md).
    per_cluster: Mapping[str, Mapping[str, float | None]] = field(default_factory=dict, compare=False)

    def limit(self, resource: str) -> float | None:
        return self.max_cpus if resource == "CPU" else self.max_gpus

    @property
    def label(self) -> str:
        return self.name or self.id

    def on_cluster(self, cluster: str) -> ProjectQuota:
        """This quota on one cluster: each limit the lower of its own and the cluster's cap (the label names the
        cap, so that a message like "uses 2 of 2 CPUs" can be followed)."""
        cap = self.per_cluster.get(cluster)
        if not cap:
            return self

        def lower(own, capped):
            return own if capped is None else capped if own is None else min(own, capped)

        return replace(
            self,
            name=f"{self.label} (on cluster {cluster}, capped by per_cluster)",
            max_cpus=lower(self.max_cpus, cap.get("max_cpus")),
            max_gpus=lower(self.max_gpus, cap.get("max_gpus")),
            max_running_jobs=lower(self.max_running_jobs, cap.get("max_running_jobs")),
        )


@dataclass(frozen=True)
class Waiting:
    """A QUEUED job or sweep."""

    key: str  # unique among the tick's runs, e.g. "job:<id>"
    project_id: str
    priority: int
    created_at: datetime  # its submit: the age that orders a project's runs of one priority
    demand: Demand
    # When it last entered QUEUED (its submit, or its requeue after a preemption): the starvation guard's clock,
    # so a preempted run does not claim the reservation for the wait before it first ran. None: created_at.
    queued_at: datetime | None = None
    # A deployment's replicas: not a run (no max_running_jobs, never a preemptor, never failed for the cluster).
    is_run: bool = True
    needs: str = "this job needs {}"  # how the quota message names it ("this deployment needs {}")
    preemptible: bool = True  # False (its spec's ``preemptible: false``): it never borrows, like a deployment

    @property
    def waiting_since(self) -> datetime:
        return self.queued_at or self.created_at


@dataclass(frozen=True)
class Holding:
    """What holds resources now: an admitted job or sweep, or a project's Serve replicas."""

    key: str
    project_id: str
    request: Mapping[str, float]
    priority: int = 0
    started_at: datetime | None = None
    borrowing: bool = False
    is_run: bool = True  # counts against max_running_jobs (a deployment does not)
    preemptible: bool = True
    cluster: str | None = None  # where it holds them (None: the default cluster); the policy plans one at a time


@dataclass(frozen=True)
class Preemption:
    """``for_key`` cannot start otherwise: ``eligible`` (key -> trigger: "priority", "quota" for a run that
    borrows, "fair_share"), in victim order, may be preempted for it; ``free`` is what it may take now (the
    cluster's free resources, capped by its project's quota headroom); ``victims`` is the shortest prefix
    that frees enough (``orchestrator.services.preemption.choose_victims`` makes the final
    choice: it also knows which runs are already being preempted)."""

    for_key: str
    for_project: str
    priority: int
    need: Mapping[str, float]
    free: Mapping[str, float]
    eligible: tuple[tuple[str, str], ...]
    victims: tuple[str, ...]

    @property
    def trigger_of(self) -> dict[str, str]:
        return dict(self.eligible)


@dataclass
class TickPlan:
    admit: list[tuple[str, bool]] = field(default_factory=list)  # (key, borrowing), in order
    waits: dict[str, tuple[str, str]] = field(default_factory=dict)  # key -> (reason, message)
    fail: dict[str, str] = field(default_factory=dict)  # key -> why it can never run
    preemption: Preemption | None = None
    reserved_for: str | None = None  # the starved run holding a reservation, if any


def _fmt(amount: float) -> str:
    return f"{amount:g}"


def dominant_share(request: Mapping[str, float], capacity: Mapping[str, float]) -> float:
    """The larger of the request's CPU and GPU fraction of the cluster (a resource the cluster lacks: skipped)."""
    return max((request.get(r, 0.0) / capacity[r] for r in RESOURCES if capacity.get(r, 0.0) > _EPS), default=0.0)


def decayed_shares(
    previous: Mapping[str, float] | None, elapsed_s: float, current: Mapping[str, float], half_life_s: float
) -> dict[str, float]:
    """Each project's dominant share with a memory: what it holds now, or what it held before decayed by half
    every ``half_life_s``, whichever is larger. A project counts what it takes at once, and one that has just
    filled the cluster keeps a high share for a while after its runs end (it does not jump the queue ahead of
    projects that waited). With no history (the first tick, a new leader), or a half-life of 0, the share in
    use now."""
    if previous is None or half_life_s <= 0:
        return {p: s for p, s in current.items() if s > _EPS}
    keep = 0.5 ** (max(0.0, elapsed_s) / half_life_s)
    shares = {p: max(current.get(p, 0.0), previous.get(p, 0.0) * keep) for p in {*previous, *current}}
    return {p: s for p, s in shares.items() if s > 1e-6}


def in_use(holding: Iterable[Holding]) -> tuple[dict[str, dict[str, float]], dict[str, int]]:
    """Per project: the CPUs and GPUs its runs and replicas hold, and how many runs it has admitted."""
    used: dict[str, dict[str, float]] = {}
    running: dict[str, int] = {}
    for h in holding:
        bucket = used.setdefault(h.project_id, dict.fromkeys(RESOURCES, 0.0))
        for r in RESOURCES:
            bucket[r] += h.request.get(r, 0.0)
        running[h.project_id] = running.get(h.project_id, 0) + (1 if h.is_run else 0)
    return used, running


def over_quota(
    quota: ProjectQuota, used: Mapping[str, float], request: Mapping[str, float], needs: str = "this job needs {}"
) -> tuple[str, str] | None:
    """(resource, message) of the first of CPUs and GPUs that ``request`` would take past the quota, e.g.
    ("GPU", "project vision uses 6 of 8 GPUs; this job needs 4"), or None."""
    for r in ("GPU", "CPU"):
        limit = quota.limit(r)
        need = request.get(r, 0.0)
        if limit is not None and need > _EPS and used.get(r, 0.0) + need > limit + _EPS:
            message = (
                f"project {quota.label} uses {_fmt(used.get(r, 0.0))} of {_fmt(limit)} {_UNITS[r]}; "
                + needs.format(_fmt(need))
            )
            return r, message
    return None


def never_fits_quota(quota: ProjectQuota, demand: Demand, preemptible: bool = True) -> str | None:
    """Why a run could never start under its project's quota (a 422 at submit), or None. A project that may
    borrow can run a job past its CPU/GPU quota on idle capacity, so only ``max_running_jobs`` 0 counts then;
    a run that may not be preempted never borrows (``NON_PREEMPTIBLE_DO_NOT_BORROW``), so its quota binds."""
    if quota.max_running_jobs == 0:
        return (
            f"project {quota.label} may run no job (max_running_jobs is 0): "
            "ask a cluster-wide admin to raise it (PUT /v1/projects/{id}/quota)"
        )
    if quota.borrowing and preemptible:
        return None
    why_not = "it may not borrow" if not quota.borrowing else NON_PREEMPTIBLE_DO_NOT_BORROW
    for r in RESOURCES:
        limit = quota.limit(r)
        need = demand.total.get(r, 0.0)
        if limit is not None and need > limit + _EPS:
            return (
                f"needs {_fmt(need)} {r} for {demand.what} but project {quota.label}'s quota is "
                f"{_fmt(limit)} {_UNITS[r]} ({_LIMITS[r]}) and {why_not}: ask for less, "
                "or ask a cluster-wide admin to raise the quota (PUT /v1/projects/{id}/quota)"
            )
    return None


class _State:
    """What the plan has handed out so far this tick."""

    def __init__(self, capacity: ClusterCapacity, holding: Sequence[Holding], shares: Mapping[str, float]):
        self.capacity = dict(capacity.total)  # shares are measured against the whole cluster
        self.outside = dict(capacity.held_outside)  # Ray jobs the control plane did not submit
        self.free = free_of(capacity, reserved_by(h.request for h in holding))
        self.held_back = dict.fromkeys(RESOURCES, 0.0)  # a starved run's reservation
        self.used, self.running = in_use(holding)
        self.shares = dict(shares)

    def outside_note(self) -> str:
        """Said to a waiting run when Ray jobs the scheduler did not start hold part of the cluster."""
        held = ", ".join(f"{_fmt(amount)} {r}" for r, amount in sorted(self.outside.items()) if amount > _EPS)
        return f" ({held} held by Ray jobs the control plane did not submit)" if held else ""

    def available(self) -> dict[str, float]:
        return {r: max(0.0, self.free[r] - self.held_back[r]) for r in RESOURCES}

    def used_by(self, project_id: str) -> dict[str, float]:
        return self.used.get(project_id, dict.fromkeys(RESOURCES, 0.0))

    def take(self, run: Waiting) -> None:
        request = run.demand.total
        bucket = self.used.setdefault(run.project_id, dict.fromkeys(RESOURCES, 0.0))
        for r in RESOURCES:
            self.free[r] = max(0.0, self.free[r] - request.get(r, 0.0))
            bucket[r] += request.get(r, 0.0)
        self.running[run.project_id] = self.running.get(run.project_id, 0) + (1 if run.is_run else 0)
        self.shares[run.project_id] = self.shares.get(run.project_id, 0.0) + dominant_share(request, self.capacity)


def plan_tick(
    waiting: Sequence[Waiting],
    holding: Sequence[Holding],
    quotas: Mapping[str, ProjectQuota],
    capacity: ClusterCapacity,
    shares: Mapping[str, float],
    now: datetime,
    starvation_s: float,
) -> TickPlan:
    """The tick's decisions (module docstring). ``shares``: each project's decayed dominant share
    (``decayed_shares``); a project missing from ``quotas`` has no limits and weight 1."""
    plan = TickPlan()
    state = _State(capacity, holding, shares)

    def quota_of(project_id: str) -> ProjectQuota:
        return quotas.get(project_id) or ProjectQuota(id=project_id)

    runs: list[Waiting] = []
    for run in waiting:
        impossible = never_fits(run.demand, capacity)
        if impossible and run.is_run:
            plan.fail[run.key] = impossible
        elif impossible:  # a deployment is not failed for a cluster that shrank: it waits for nodes
            plan.waits[run.key] = (INSUFFICIENT, f"can never fit the cluster as it is now: {impossible}")
        else:
            runs.append(run)

    deferred: list[tuple[Waiting, str]] = []  # past their CPU/GPU quota, may borrow: after everyone else

    def consider(run: Waiting) -> bool:
        """Admit ``run`` if it may start; otherwise note why it waits. True when admitted."""
        quota = quota_of(run.project_id)
        request = run.demand.total
        if (
            run.is_run
            and quota.max_running_jobs is not None
            and state.running.get(run.project_id, 0) >= quota.max_running_jobs
        ):
            plan.waits[run.key] = (
                QUOTA_EXCEEDED,
                f"project {quota.label} runs {state.running.get(run.project_id, 0)} of "
                f"{quota.max_running_jobs} jobs at once (max_running_jobs)",
            )
            return False
        over = over_quota(quota, state.used_by(run.project_id), request, run.needs)
        if over is not None:
            if quota.borrowing and run.is_run and run.preemptible:
                deferred.append((run, over[1]))
            elif quota.borrowing:  # borrowed capacity is given back by preemption: what is never preempted waits
                why = NON_PREEMPTIBLE_DO_NOT_BORROW if run.is_run else DEPLOYMENTS_DO_NOT_BORROW
                plan.waits[run.key] = (QUOTA_EXCEEDED, f"{over[1]} ({why})")
            else:
                plan.waits[run.key] = (QUOTA_EXCEEDED, f"{over[1]} (borrowing is off)")
            return False
        missing = shortfall(request, state.available())
        if missing is None:
            plan.admit.append((run.key, False))
            state.take(run)
            return True
        plan.waits[run.key] = (INSUFFICIENT, f"waiting for resources: {missing}{state.outside_note()}")
        return False

    # 2. The starvation guard: the longest waiting first; the first that cannot start holds a reservation.
    starved = sorted(
        (r for r in runs if (now - r.waiting_since).total_seconds() >= starvation_s),
        key=lambda r: (r.waiting_since, r.key),
    )
    starved_keys = {r.key for r in starved}
    for run in starved:
        if consider(run) or plan.reserved_for is not None:
            continue
        if plan.waits.get(run.key, ("",))[0] == INSUFFICIENT:
            plan.reserved_for = run.key
            for r in RESOURCES:
                state.held_back[r] = min(state.free[r], run.demand.total.get(r, 0.0))
            reason, message = plan.waits[run.key]
            plan.waits[run.key] = (reason, f"{message} (waited past the starvation guard: resources are held for it)")

    # 3.-5. Fair share between projects, priority then age within each.
    queues: dict[str, list[Waiting]] = {}
    for run in sorted(runs, key=lambda r: (-r.priority, r.created_at, r.key)):
        if run.key not in starved_keys:
            queues.setdefault(run.project_id, []).append(run)

    def fair_key(project_id: str) -> tuple[float, str]:
        return state.shares.get(project_id, 0.0) / quota_of(project_id).weight, project_id

    heap = [(*fair_key(p), 0) for p in queues]
    heapq.heapify(heap)
    order: list[Waiting] = []  # the order runs were considered in (for preemption)
    while heap:
        _, project_id, index = heapq.heappop(heap)
        run = queues[project_id][index]
        order.append(run)
        consider(run)
        if index + 1 < len(queues[project_id]):
            heapq.heappush(heap, (*fair_key(project_id), index + 1))

    # 4. Borrowers, in the same order, on what is left.
    for run, over in deferred:
        missing = shortfall(run.demand.total, state.available())
        if missing is None:
            plan.admit.append((run.key, True))
            state.take(run)
        else:
            now_over = over_quota(quota_of(run.project_id), state.used_by(run.project_id), run.demand.total, run.needs)
            plan.waits[run.key] = (
                QUOTA_EXCEEDED,
                f"{now_over[1] if now_over else over}; no idle capacity to borrow: {missing}",
            )

    # 6. Preemption: the reserved run first, then in fair-share order; the first run that can start by it asks.
    candidates = [r for r in starved if r.key == plan.reserved_for] + order + [run for run, _ in deferred]
    seen: set[str] = set()
    for run in candidates:
        reason = plan.waits.get(run.key, ("",))[0]
        if run.key in seen or reason not in (INSUFFICIENT, QUOTA_EXCEEDED) or not run.is_run:
            continue  # a deployment preempts nobody: it waits until its project's jobs give the room back
        seen.add(run.key)
        plan.preemption = _preemption_for(run, reason, holding, state, quota_of)
        if plan.preemption is not None:
            break  # one preemption a tick
    return plan


def fair_shares(
    projects: Iterable[str], quota_of, shares: Mapping[str, float]
) -> tuple[dict[str, float], dict[str, float]]:
    """(each project's entitled share: its weight over the weights of the projects that hold or want
    resources, each project's share / entitlement)."""
    projects = sorted(set(projects))
    total_weight = sum(quota_of(p).weight for p in projects) or 1.0
    entitled = {p: quota_of(p).weight / total_weight for p in projects}
    return entitled, {p: shares.get(p, 0.0) / entitled[p] for p in projects}


def victim_order(victim: Holding) -> tuple:
    """Lowest priority first, then borrowing, then the youngest (the least work lost)."""
    started = victim.started_at.timestamp() if victim.started_at else float("inf")
    return (victim.priority, not victim.borrowing, -started, victim.key)


def _preemption_for(
    run: Waiting, reason: str, holding: Sequence[Holding], state: _State, quota_of
) -> Preemption | None:
    """Whom ``run`` may preempt, and whether that would let it start. A run over its project's quota may take
    only its own project's lower-priority runs (which give back quota too); one waiting for the cluster also
    borrowers of other projects, and runs of projects above their fair share while its own is below."""
    mine = run.project_id
    quota = quota_of(mine)
    projects = {h.project_id for h in holding} | {mine}
    entitled, ratio = fair_shares(projects, quota_of, state.shares)
    under_share = ratio.get(mine, 0.0) + dominant_share(run.demand.total, state.capacity) / entitled[mine] <= 1.0 + _EPS
    eligible: list[tuple[Holding, str]] = []
    for h in holding:
        if not h.preemptible or not h.is_run:
            continue
        if h.project_id == mine and h.priority < run.priority:
            eligible.append((h, "priority"))
        elif reason != INSUFFICIENT or h.project_id == mine:
            continue
        elif h.borrowing:
            eligible.append((h, "quota"))  # the capacity it borrows is wanted back
        elif under_share and ratio.get(h.project_id, 0.0) > 1.0 + _EPS:
            eligible.append((h, "fair_share"))
    if not eligible:
        return None
    eligible.sort(key=lambda pair: victim_order(pair[0]))
    request = run.demand.total
    free = dict(state.available())
    used = dict(state.used_by(mine))
    running = state.running.get(mine, 0)
    # What the run may take now, its quota counted: the free that choose_victims weighs victims against.
    room = dict(free)
    for r in RESOURCES:
        limit = quota.limit(r)
        if limit is not None and not quota.borrowing:
            room[r] = min(room[r], max(0.0, limit - used.get(r, 0.0)))
        if quota.max_running_jobs is not None and running >= quota.max_running_jobs:
            room[r] = 0.0  # a run of its own must go first, whatever it holds

    def lacking() -> set[str]:
        """What still stops the run: a resource of the cluster ("CPU"), of its quota ("quota:CPU"), or its
        project's count of running jobs ("quota:runs")."""
        missing = {r for r in RESOURCES if request.get(r, 0.0) > free[r] + _EPS}
        over = over_quota(quota, used, request)
        if over is not None and not quota.borrowing:
            missing.add(f"quota:{over[0]}")
        if quota.max_running_jobs is not None and running >= quota.max_running_jobs:
            missing.add("quota:runs")
        return missing

    chosen: list[Holding] = []
    for victim, _ in eligible:
        missing = lacking()
        if not missing:
            break
        own = victim.project_id == mine
        gives = {r for r in RESOURCES if victim.request.get(r, 0.0) > _EPS}
        helps = bool(gives & missing) or (
            own and ("quota:runs" in missing or any(f"quota:{r}" in missing for r in gives))
        )
        if not helps:
            continue  # frees nothing this run lacks
        chosen.append(victim)
        running -= 1 if own else 0
        for r in RESOURCES:
            free[r] += victim.request.get(r, 0.0)
            if own:
                used[r] -= victim.request.get(r, 0.0)
    if not chosen or lacking():
        return None
    return Preemption(
        for_key=run.key,
        for_project=mine,
        priority=run.priority,
        need=dict(request),
        free=room,
        eligible=tuple((v.key, trigger) for v, trigger in eligible),
        victims=tuple(v.key for v in chosen),
    )
