"""Which cluster each queued run goes to (docs/clusters.md), before the policy plans each cluster on its own.

A run may use the clusters its project is bound to (none bound: the default cluster) that match its placement.
A run placed before stays where it was (its checkpoints are there). Otherwise, among those that can be reached,
the scheduler takes one where the whole run fits now, the one with most free capacity first; when none has
room now, the one with most capacity where it could ever fit, so it waits (or preempts) there. Pure functions:
the scheduler loop reads the rows and Ray and acts on the answer.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from orchestrator.admission import RESOURCES, ClusterCapacity, Demand, never_fits
from orchestrator.scheduling.policy import Holding, ProjectQuota, in_use
from orchestrator_contract.placement import Placement

_EPS = 1e-9
CLUSTER_UNAVAILABLE = "cluster_unavailable"
NO_CLUSTER = "no_cluster"  # its placement matches none of the clusters its project may use (bindings changed)


@dataclass(frozen=True)
class ClusterView:
    """A registered cluster as this tick sees it: ``capacity`` None when it could not be reached (``error``)."""

    name: str
    labels: Mapping[str, str]
    capacity: ClusterCapacity | None
    error: str = ""


@dataclass(frozen=True)
class ToPlace:
    key: str
    project_id: str
    demand: Demand
    placement: Placement | None = None
    pinned: str | None = None  # placed before: it stays there


@dataclass
class Placed:
    cluster: dict[str, str]  # key -> the cluster it is planned on this tick
    waits: dict[str, tuple[str, str]]  # key -> (reason, message): no cluster to plan it on now


def usable(project_id: str, bound: Mapping[str, set[str]], default: str) -> set[str]:
    """The clusters a project may use: those it is bound to, or else the default one."""
    return set(bound.get(project_id) or {default})


def place(
    runs: Sequence[ToPlace],
    views: Mapping[str, ClusterView],
    holding: Iterable[Holding],
    bound: Mapping[str, set[str]],
    default: str,
    quotas: Mapping[str, ProjectQuota] | None = None,
) -> Placed:
    """Each run's cluster for this tick, in the order given (admission order: an earlier run's pick takes the room it
    fits in first), or why it has none. With ``quotas``, a cluster where the run's project is at its cap
    (``per_cluster``) is taken only when no other could ever hold the run."""
    holding = list(holding)
    free = {name: _free(view, [h for h in holding if (h.cluster or default) == name]) for name, view in views.items()}
    capped = _CapRoom(quotas or {}, holding, default)
    placed = Placed({}, {})
    for run in runs:
        allowed = usable(run.project_id, bound, default)
        if run.pinned is not None:
            names = [run.pinned] if (run.pinned in allowed and run.pinned in views) else []
        else:
            names = sorted(
                n for n in allowed if n in views and (run.placement is None or _matches(run.placement, views[n]))
            )
        if not names:
            asked = run.placement.describe() if run.placement is not None else "any"
            where = f"the cluster it ran on ({run.pinned})" if run.pinned else f"placement {asked}"
            placed.waits[run.key] = (
                NO_CLUSTER,
                f"no cluster its project may use matches {where}; it may use: {', '.join(sorted(allowed))}",
            )
            continue
        reachable = [n for n in names if views[n].capacity is not None]
        if not reachable:
            errors = "; ".join(f"{n}: {views[n].error}" for n in names)
            placed.waits[run.key] = (CLUSTER_UNAVAILABLE, f"waiting for cluster {', '.join(names)} ({errors})")
            continue
        possible = [n for n in reachable if never_fits(run.demand, views[n].capacity) is None] or reachable
        possible = [n for n in possible if capped.has_room(run, n)] or possible
        fits_now = [n for n in possible if _fits(run.demand.total, free[n])]
        if fits_now:
            pick = max(fits_now, key=lambda n: _room(free[n]))  # names are sorted: a tie goes to the first
            for resource in RESOURCES:
                free[pick][resource] -= run.demand.total.get(resource, 0.0)
        else:
            pick = max(possible, key=lambda n: _room(views[n].capacity.total))
        capped.take(run, pick)
        placed.cluster[run.key] = pick
    return placed


class _CapRoom:
    """What each project holds on each cluster, against its caps there (``ProjectQuota.per_cluster``), with this
    tick's picks added as they are made."""

    def __init__(self, quotas: Mapping[str, ProjectQuota], holding: Iterable[Holding], default: str):
        self.quotas = quotas
        self.held: dict[tuple[str, str], dict[str, float]] = {}
        for h in holding:
            self._add(h.project_id, h.cluster or default, h.request, 1 if h.is_run else 0)

    def _add(self, project_id: str, cluster: str, request: Mapping[str, float], runs: int) -> None:
        held = self.held.setdefault((project_id, cluster), {"CPU": 0.0, "GPU": 0.0, "runs": 0})
        for resource in RESOURCES:
            held[resource] += request.get(resource, 0.0)
        held["runs"] += runs

    def has_room(self, run: ToPlace, cluster: str) -> bool:
        quota = self.quotas.get(run.project_id)
        cap = quota.per_cluster.get(cluster) if quota is not None else None
        if not cap:
            return True
        held = self.held.get((run.project_id, cluster), {"CPU": 0.0, "GPU": 0.0, "runs": 0})
        limits = {"CPU": cap.get("max_cpus"), "GPU": cap.get("max_gpus"), "runs": cap.get("max_running_jobs")}
        asked = {**run.demand.total, "runs": 1}
        return all(limit is None or held[k] + asked.get(k, 0.0) <= limit + _EPS for k, limit in limits.items())

    def take(self, run: ToPlace, cluster: str) -> None:
        if run.pinned is None:  # a deployment's replicas (pinned) are held already, and not a run
            self._add(run.project_id, cluster, run.demand.total, 1)


def quotas_here(
    quotas: Mapping[str, ProjectQuota], elsewhere: Iterable[Holding], cluster: str | None = None
) -> dict[str, ProjectQuota]:
    """A project's quota counts across all clusters: on one cluster, what it may still take is its quota less what
    it holds on the others (its label says so, so a message like "uses 2 of 2 CPUs" can be followed), and no more
    than its cap on that cluster (``per_cluster``), if it has one."""
    used, running = in_use(elsewhere)
    here = {}
    for project_id, quota in quotas.items():
        held = used.get(project_id)
        if held is not None:
            cpus, gpus, runs = held.get("CPU", 0.0), held.get("GPU", 0.0), running.get(project_id, 0)
            quota = replace(
                quota,
                name=f"{quota.label} (less {cpus:g} CPUs, {gpus:g} GPUs, {runs} runs on its other clusters)",
                max_cpus=None if quota.max_cpus is None else max(0.0, quota.max_cpus - cpus),
                max_gpus=None if quota.max_gpus is None else max(0.0, quota.max_gpus - gpus),
                max_running_jobs=None if quota.max_running_jobs is None else max(0, quota.max_running_jobs - runs),
            )
        here[project_id] = quota.on_cluster(cluster) if cluster else quota
    return here


def combined(capacities: Iterable[ClusterCapacity]) -> ClusterCapacity:
    """Every reachable cluster's capacity together: what fair shares are measured against."""
    total: dict[str, float] = {}
    largest: dict[str, float] = {}
    for capacity in capacities:
        for resource, amount in capacity.total.items():
            total[resource] = total.get(resource, 0.0) + amount
        for resource, amount in capacity.largest_node.items():
            largest[resource] = max(largest.get(resource, 0.0), amount)
    return ClusterCapacity(total, largest)


def _matches(placement: Placement, view: ClusterView) -> bool:
    return placement.matches(view.name, dict(view.labels))


def _free(view: ClusterView, holding: list[Holding]) -> dict[str, float]:
    if view.capacity is None:
        return dict.fromkeys(RESOURCES, 0.0)
    usable = view.capacity.usable()
    free = {r: usable.get(r, 0.0) for r in RESOURCES}
    for h in holding:
        for r in RESOURCES:
            free[r] -= h.request.get(r, 0.0)
    return free


def _fits(request: Mapping[str, float], free: Mapping[str, float]) -> bool:
    return all(request.get(r, 0.0) <= free.get(r, 0.0) + _EPS for r in RESOURCES)


def _room(amounts: Mapping[str, float]) -> tuple[float, float]:
    return (amounts.get("GPU", 0.0), amounts.get("CPU", 0.0))
