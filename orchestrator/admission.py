"""Admission arithmetic: does a worker group fit the cluster, now or ever? Pure functions."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from workers.spec import JobSpec

RESOURCES = ("CPU", "GPU")
_EPS = 1e-9


@dataclass(frozen=True)
class ClusterCapacity:
    """Totals over alive nodes, and the largest single node (a worker can't span nodes)."""

    total: dict[str, float] = field(default_factory=dict)
    largest_node: dict[str, float] = field(default_factory=dict)


def request_of(spec: JobSpec) -> dict[str, float]:
    return spec.scaling.total_resources()


def _fmt(amount: float) -> str:
    return f"{amount:g}"


def never_fits(spec: JobSpec, capacity: ClusterCapacity) -> str | None:
    """Why this job could not run even on an idle cluster, or None if it could."""
    request = request_of(spec)
    per_worker = {"CPU": spec.scaling.cpus_per_worker, "GPU": spec.scaling.gpus_per_worker or 0.0}
    for resource in RESOURCES:
        total = capacity.total.get(resource, 0.0)
        if request[resource] > total + _EPS:
            return (
                f"needs {_fmt(request[resource])} {resource} for {spec.scaling.num_workers} workers "
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
    return {r: max(0.0, capacity.total.get(r, 0.0) - reserved.get(r, 0.0)) for r in RESOURCES}


def shortfall(request: Mapping[str, float], free: Mapping[str, float]) -> str | None:
    """A human-readable reason the request doesn't fit right now, e.g. "needs 4 CPU, 1 free"."""
    missing = [
        f"needs {_fmt(request[r])} {r}, {_fmt(free.get(r, 0.0))} free"
        for r in RESOURCES
        if request.get(r, 0.0) > free.get(r, 0.0) + _EPS
    ]
    return "; ".join(missing) or None
