"""Admission arithmetic: does a worker group (a job's, a sweep's concurrent trials, a deployment's replicas)
fit the cluster, now or ever? Pure functions."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from orchestrator_contract.jobs import JobSpec, ScalingSpec
from orchestrator_contract.sweeps import SweepSpec

RESOURCES = ("CPU", "GPU")
_EPS = 1e-9


@dataclass(frozen=True)
class ClusterCapacity:
    """Totals over alive nodes, and the largest single node (a worker can't span nodes). ``held_outside``: what
    Ray jobs the control plane did not submit hold now (``services.foreign_jobs``): never handed out, but no
    reason a run could never fit."""

    total: dict[str, float] = field(default_factory=dict)
    largest_node: dict[str, float] = field(default_factory=dict)
    held_outside: dict[str, float] = field(default_factory=dict)

    def usable(self) -> dict[str, float]:
        """The total less what is held outside the scheduler."""
        return {r: max(0.0, amount - self.held_outside.get(r, 0.0)) for r, amount in self.total.items()}


@dataclass(frozen=True)
class Demand:
    """What a run asks of the cluster all at once (``total``), its largest single piece (one worker, which
    can't span nodes) and, for messages, what it is made of."""

    total: dict[str, float]
    per_worker: dict[str, float]
    what: str


def demand_of(spec: JobSpec) -> Demand:
    return scaling_demand(spec.scaling)


def scaling_demand(scaling: ScalingSpec) -> Demand:
    """A job's demand from its scaling alone: what the scheduler reads back for every queued job every
    tick, without validating the whole stored spec again."""
    return Demand(
        total=scaling.total_resources(),
        per_worker={"CPU": scaling.cpus_per_worker, "GPU": scaling.gpus_per_worker or 0.0},
        what=f"{scaling.num_workers} workers",
    )


def sweep_demand(spec: SweepSpec) -> Demand:
    """Room for ``max_concurrent_trials`` trials at once (fewer if the sweep has fewer), each at its largest
    scaling: Tune never runs more, so they never wait in Ray. The small actor that drives each trial asks no
    CPU (``orchestrator_contract.sweeps.TRIAL_DRIVER_RESOURCES``), so 2 trials of 1 CPU fit 2 CPUs."""
    trial = demand_of(spec.worst_case_trial())
    concurrent = spec.concurrency
    return Demand(
        total={r: concurrent * trial.total.get(r, 0.0) for r in RESOURCES},
        per_worker=trial.per_worker,
        what=f"{concurrent} concurrent trial(s) of {trial.what} (lower max_concurrent_trials to fit)",
    )


def request_of(spec: JobSpec) -> dict[str, float]:
    return demand_of(spec).total


def _fmt(amount: float) -> str:
    return f"{amount:g}"


def never_fits(demand: Demand | JobSpec, capacity: ClusterCapacity) -> str | None:
    """Why this run could not run even on an idle cluster, or None if it could."""
    if isinstance(demand, JobSpec):
        demand = demand_of(demand)
    request, per_worker = demand.total, demand.per_worker
    for resource in RESOURCES:
        total = capacity.total.get(resource, 0.0)
        if request[resource] > total + _EPS:
            return (
                f"needs {_fmt(request[resource])} {resource} for {demand.what} "
                f"but the whole cluster has {_fmt(total)} {resource}"
            )
        largest = capacity.largest_node.get(resource, 0.0)
        if per_worker[resource] > largest + _EPS:
            return (
                f"each worker needs {_fmt(per_worker[resource])} {resource} "
                f"but the largest node has {_fmt(largest)} {resource}"
            )
    return None


def reserved_by(requests: Iterable[Mapping[str, float]]) -> dict[str, float]:
    reserved = dict.fromkeys(RESOURCES, 0.0)
    for request in requests:
        for resource in RESOURCES:
            reserved[resource] += request.get(resource, 0.0)
    return reserved


def free_of(capacity: ClusterCapacity, reserved: Mapping[str, float]) -> dict[str, float]:
    usable = capacity.usable()
    return {r: max(0.0, usable.get(r, 0.0) - reserved.get(r, 0.0)) for r in RESOURCES}


def shortfall(request: Mapping[str, float], free: Mapping[str, float]) -> str | None:
    """A human-readable reason the request doesn't fit right now, e.g. "needs 4 CPU, 1 free"."""
    missing = [
        f"needs {_fmt(request[r])} {r}, {_fmt(free.get(r, 0.0))} free"
        for r in RESOURCES
        if request.get(r, 0.0) > free.get(r, 0.0) + _EPS
    ]
    return "; ".join(missing) or None


def replicas_demand(settings: Mapping[str, Any]) -> Demand:
    """What a deployment version's replicas hold: per replica x most replicas (the count, or autoscaling's
    ``max``); its "worker" is one replica."""
    replicas = settings["replicas"]
    most = replicas if isinstance(replicas, int) else int(replicas["max"])
    resources = settings["resources"]
    per_replica = {"CPU": float(resources["cpus"]), "GPU": float(resources["gpus"])}
    return Demand({r: most * amount for r, amount in per_replica.items()}, per_replica, f"{most} replicas")


def replicas_beyond(settings: Mapping[str, Any], serving: Mapping[str, Any] | None) -> Demand:
    """What a deployment version's replicas (``settings``) ask on top of those of the version serving now
    (``serving``'s settings; None: nothing serves), which they replace."""
    demand = replicas_demand(settings)
    held = replicas_demand(serving).total if serving is not None else {}
    return Demand(
        {r: max(0.0, demand.total.get(r, 0.0) - held.get(r, 0.0)) for r in RESOURCES}, demand.per_worker, demand.what
    )


def asks_nothing(request: Mapping[str, float]) -> bool:
    return all(request.get(r, 0.0) <= _EPS for r in RESOURCES)
