"""Who the caller is and what the cluster is doing: ``GET /v1/whoami`` and ``GET /v1/cluster``."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from orchestrator_contract.base import FromAttributes
from orchestrator_contract.states import JobState, Role


class WhoAmI(BaseModel):
    """``GET /v1/whoami``: the key the request was made with. The environment's admin token
    (ORCHESTRATOR_ADMIN_TOKEN) is no stored key: its key and project fields are null."""

    key_id: str | None = Field(description="The key's id; null for the environment's admin token.")
    key_name: str | None = Field(description="The key's label (may be empty); null for the environment's admin token.")
    role: Role = Field(description="admin, member or viewer.")
    project_id: str | None = Field(description="The project the key acts in; null for the environment's admin token.")
    project_name: str | None = Field(description="That project's name; null for the environment's admin token.")
    cluster_admin: bool = Field(description="Whether the key reaches every project and makes projects.")
    expires_at: datetime | None = Field(None, description="When the key stops working (UTC); null: never.")


class QueuedJobOut(FromAttributes):
    """A job waiting to be admitted, and why it waits."""

    id: str
    name: str = Field(description="Its display name (may be empty).")
    project_id: str
    priority: int = Field(description="Higher is admitted first.")
    reason: str = Field(
        description="Why it waits, as a code (e.g. insufficient_resources); empty before the first try."
    )
    message: str = Field(description="Why it waits, for people (e.g. 'waiting for resources: needs 4 CPU, 2 free').")
    created_at: datetime
    waiting_on: str | None = Field(
        None,
        description="The cluster it waits for: where the scheduler last planned it (null: none it may use yet, or "
        "not looked at yet).",
    )


class NodeFaultOut(FromAttributes):
    """A hang or a straggler blamed on a node."""

    kind: Literal["hung", "straggler"]
    job_id: str
    attempt: int
    message: str
    created_at: datetime


class BadNodeOut(BaseModel):
    """A Ray node kept out of placement: it hung or straggled ``faults`` times within the window
    (ORCHESTRATOR_BAD_NODE_*; docs/jobs.md "Bad nodes")."""

    node_id: str = Field(description="The Ray node id (what `ray list nodes` shows).")
    excluded_until: datetime = Field(description="When the cool-down ends and the node is placed on again (UTC).")
    fault_count: int = Field(description="How many faults not cleared keep it out (every project's).")
    faults: list[NodeFaultOut] = Field(
        description="Those of them in the caller's project's jobs (a cluster admin: all), oldest first."
    )


class ForeignJobOut(BaseModel):
    """A live Ray job on a cluster that the control plane did not submit (docs/clusters.md): someone used the
    cluster's Ray directly. What it holds is kept out of what the scheduler hands out."""

    id: str = Field(description="Ray's submission id; a driver that connected itself: `driver:<Ray job id>`.")
    kind: Literal["submission", "driver"] = Field(description="Submitted through Ray's Jobs API, or a driver.")
    status: str = Field(description="Ray's status: PENDING or RUNNING.")
    entrypoint: str = Field(description="Its command, as Ray lists it (the first 200 characters).")
    holds: dict[str, float] = Field(description="The CPUs and GPUs it holds now, e.g. {'CPU': 1}.")


class ClusterHealthOut(BaseModel):
    """One Ray cluster the caller's runs may use (docs/clusters.md), as ``GET /v1/cluster`` lists them."""

    name: str = Field(description="The cluster's name (`placement.cluster`).")
    is_default: bool = Field(description="The service's own cluster (every project with no binding uses it).")
    labels: dict[str, str] = Field(description="Its labels (`placement.labels`).")
    ray: Literal["ok", "unavailable"] = Field(description="Whether its Ray answered just now.")
    nodes: int = Field(description="Its alive nodes (0 when it does not answer).")
    total: dict[str, float] = Field(description="What its alive nodes hold.")
    available: dict[str, float] = Field(
        description="What is left on it for new runs: the total less what the runs and deployments on it hold, "
        "and what Ray jobs the control plane did not submit hold (`held_outside`)."
    )
    running: int = Field(description="Jobs and sweeps admitted on it and not yet ended (all projects').")
    queued: int = Field(
        0, description="QUEUED jobs and sweeps waiting for it (all projects'): where the scheduler last planned them."
    )
    held_outside: dict[str, float] = Field(
        default_factory=dict,
        description="What Ray jobs the control plane did not submit hold on it now (empty: none).",
    )
    foreign: list[ForeignJobOut] = Field(
        default_factory=list,
        description="Those jobs, each with what it holds; listed to cluster-wide admins only (others see the sum "
        "in `held_outside`).",
    )


class ClusterStatus(BaseModel):
    """``GET /v1/cluster``: the Ray cluster's resources (what the scheduler sees) and the jobs in the key's scope.
    Answered (200) when Ray is down too: ``ray`` says so and the resources are empty."""

    ray: Literal["ok", "unavailable"] = Field(description="Whether the Ray cluster answered.")
    total: dict[str, float] = Field(description="What the cluster's alive nodes hold, e.g. {'CPU': 8, 'GPU': 2}.")
    available: dict[str, float] = Field(
        description="What is left for new jobs: the total less what running jobs, sweeps and deployments hold "
        "(the scheduler's own reckoning)."
    )
    jobs: dict[JobState, int] = Field(description="How many jobs are in each state (every state, 0 included).")
    queue: list[QueuedJobOut] = Field(
        description="The QUEUED jobs in admission order (priority, then age), the first ``queue_limit``."
    )
    queue_limit: int = Field(description="The most jobs ``queue`` lists; ``jobs['QUEUED']`` counts them all.")
    bad_nodes: list[BadNodeOut] = Field(
        default_factory=list,
        description="Nodes kept out of placement now, and why; a cluster admin clears one with "
        "DELETE /v1/cluster/bad-nodes/{node_id}.",
    )
    clusters: list[ClusterHealthOut] = Field(
        default_factory=list,
        description="Every Ray cluster the key's runs may use (a cluster-wide admin: every registered one), each "
        "with its health, nodes and capacity; `ray`, `total` and `available` above are the default cluster's.",
    )
