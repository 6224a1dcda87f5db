"""Where a job, sweep or deployment runs (docs/clusters.md): a named cluster, or clusters with some labels,
among those its project may use. Unset: the scheduler picks one of the project's clusters."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import Field, StringConstraints, model_validator

from orchestrator_contract.base import Strict

CLUSTER_NAME_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,62})$"  # a DNS label: also a Kubernetes RayCluster's name
ClusterName = Annotated[str, StringConstraints(pattern=CLUSTER_NAME_PATTERN)]
ClusterLabels = dict[
    Annotated[str, StringConstraints(min_length=1, max_length=63)],
    Annotated[str, StringConstraints(max_length=63)],
]


class Placement(Strict):
    cluster: ClusterName | None = Field(None, description="Run on this cluster (one the project may use).")
    labels: ClusterLabels = Field(
        default_factory=dict,
        max_length=16,
        description='Run on a cluster carrying all these labels (e.g. {"gpu": "h100"}); the scheduler picks '
        "among those that match.",
    )

    @model_validator(mode="after")
    def _one_way(self) -> Placement:
        if self.cluster is not None and self.labels:
            raise ValueError("placement names a cluster or labels, not both")
        return self

    def matches(self, name: str, labels: dict) -> bool:
        """Whether a cluster with this name and these labels may take the run."""
        if self.cluster is not None:
            return name == self.cluster
        return all(key in labels and str(labels[key]) == value for key, value in self.labels.items())

    def describe(self) -> str:
        if self.cluster is not None:
            return f"cluster {self.cluster!r}"
        return "labels " + ", ".join(f"{k}={v}" for k, v in sorted(self.labels.items())) if self.labels else "any"


def is_cluster_name(name: str) -> bool:
    return re.match(CLUSTER_NAME_PATTERN, name) is not None
