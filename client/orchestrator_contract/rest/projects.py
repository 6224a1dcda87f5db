"""Projects (the tenants) and their API keys: ``/v1/projects``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from orchestrator_contract.base import FromAttributes
from orchestrator_contract.placement import ClusterName
from orchestrator_contract.states import Role

_MAX_PRIORITY = Field(
    None,
    ge=-1000,
    le=1000,
    description="The highest priority the project's keys may give a job or sweep (422 above it); null: no cap. "
    "Set by a cluster-wide admin only.",
)


class ProjectCreate(BaseModel):
    """``POST /v1/projects`` (cluster-wide admins)."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(
        min_length=1,
        max_length=64,
        pattern=r"^[a-z0-9][a-z0-9_-]*$",
        description="Unique among projects: lower-case letters, digits, '_' and '-'.",
    )
    max_priority: int | None = _MAX_PRIORITY


class ProjectPatch(BaseModel):
    """``PATCH /v1/projects/{id}`` (cluster-wide admins): the fields given change."""

    model_config = ConfigDict(extra="forbid")
    max_priority: int | None = _MAX_PRIORITY
    allow_non_preemptible: bool = Field(
        False, description="Its member and admin keys may submit jobs with preemptible: false (docs/scheduling.md)."
    )


MAX_CLUSTER_QUOTAS = 32


class ClusterQuota(BaseModel):
    """A project's cap on one cluster (``Quota.per_cluster``), on top of its quota across all clusters."""

    model_config = ConfigDict(extra="forbid")
    max_cpus: float | None = Field(None, ge=0, le=1_000_000, description="Logical CPUs it may hold on that cluster.")
    max_gpus: float | None = Field(None, ge=0, le=100_000, description="GPUs it may hold on that cluster.")
    max_running_jobs: int | None = Field(
        None, ge=0, le=1_000_000, description="Jobs and sweeps it may run on that cluster at once."
    )


class Quota(BaseModel):
    """``PUT /v1/projects/{id}/quota`` (cluster-wide admins) and ``ProjectOut.quota``: what the project's running
    and queued work may hold (docs/scheduling.md). A limit left out or null: no limit. The whole quota is
    replaced: a field left out goes back to its default."""

    model_config = ConfigDict(extra="forbid")
    max_cpus: float | None = Field(
        None, ge=0, le=1_000_000, description="Logical CPUs its running jobs, sweeps and deployments may hold."
    )
    max_gpus: float | None = Field(None, ge=0, le=100_000, description="GPUs they may hold.")
    max_running_jobs: int | None = Field(
        None, ge=0, le=1_000_000, description="Jobs and sweeps that may run (be admitted) at once."
    )
    max_queued: int | None = Field(
        None, ge=0, le=1_000_000, description="Jobs and sweeps that may wait QUEUED; a submit past it is a 429."
    )
    weight: float = Field(
        1.0, gt=0, le=1000, description="Its weight in fair share between projects (2: entitled to twice the share)."
    )
    borrowing: bool = Field(
        True,
        description="May use idle capacity beyond max_cpus/max_gpus; such runs are marked borrowing and are the "
        "first to be preempted.",
    )
    per_cluster: dict[ClusterName, ClusterQuota] = Field(
        default_factory=dict,
        max_length=MAX_CLUSTER_QUOTAS,
        description="Caps on single clusters by name (docs/clusters.md), each on top of the limits above, which "
        'count across all clusters: {"gpu-a": {"max_gpus": 8}}. A run is placed where its project\'s cap has room; '
        "on a capped cluster the cap binds as the quota does (borrowing included). Every name must be a registered "
        "cluster.",
    )


class ProjectOut(FromAttributes):
    """A project: the unit of tenancy. Every job, sweep, deployment and key belongs to one."""

    id: str = Field(description="The project's id (`?project_id=` of cluster-wide admins' requests).")
    name: str = Field(description="Unique among projects.")
    created_at: datetime = Field(description="When it was created (UTC).")
    max_priority: int | None = Field(
        None, description="The highest priority its keys may give a job or sweep; null: no cap."
    )
    allow_non_preemptible: bool = Field(
        False, description="Its keys may submit jobs with preemptible: false (else only a cluster-wide admin may)."
    )
    quota: Quota = Field(default_factory=Quota, description="Its quota and fair-share weight (no limits by default).")


class KeyCreate(BaseModel):
    """``POST /v1/projects/{id}/keys``: a new key for the project."""

    model_config = ConfigDict(extra="forbid")
    role: Role = Field(description="admin (also manages the project's keys), member (submits), viewer (reads).")
    name: str = Field("", max_length=64, description="A label for people; not unique.")
    scope: Literal["project", "cluster"] = Field(
        "project", description="Always 'project': a key made under a project acts in that project only."
    )
    expires_at: datetime | None = Field(None, description="When the key stops working (UTC if no zone given).")
    expires_in_days: int | None = Field(None, ge=1, le=3650, description="Or: it stops working this many days on.")

    @field_validator("scope")
    @classmethod
    def _project_only(cls, scope: str) -> str:
        if scope != "project":
            raise ValueError(
                "a key made under a project acts in that project only, whatever its role; cluster-wide admin "
                "is not made through a project route: it is the ORCHESTRATOR_ADMIN_TOKEN of the service's "
                "environment (docs/security.md)"
            )
        return scope

    @field_validator("expires_at")
    @classmethod
    def _in_the_future(cls, expires_at: datetime | None) -> datetime | None:
        if expires_at is None:
            return None
        if expires_at.tzinfo is None:
            expires_at = expires_at.replace(tzinfo=UTC)
        if expires_at <= datetime.now(UTC):
            raise ValueError("expires_at is in the past")
        return expires_at

    @model_validator(mode="after")
    def _one_expiry(self) -> KeyCreate:
        if self.expires_at is not None and self.expires_in_days is not None:
            raise ValueError("give expires_at or expires_in_days, not both")
        return self

    def expiry(self, now: datetime) -> datetime | None:
        if self.expires_in_days is not None:
            return now + timedelta(days=self.expires_in_days)
        return self.expires_at


class KeyOut(FromAttributes):
    """An API key as listed: never the secret or its hash."""

    id: str = Field(description="The key's id (`DELETE /v1/projects/{id}/keys/{key_id}` revokes it).")
    project_id: str = Field(description="The project it acts in.")
    name: str = Field(description="The label given at creation.")
    role: Role = Field(description="What it may do: admin, member or viewer.")
    prefix: str = Field(description="The first characters of the secret, to tell keys apart.")
    cluster_wide: bool = Field(description="Acts on every project (only the key the first start prints).")
    created_at: datetime = Field(description="When it was made (UTC).")
    expires_at: datetime | None = Field(description="None: it does not expire.")
    last_used_at: datetime | None = Field(description="Recorded at most once a minute; None: never used.")


class KeyCreated(KeyOut):
    """A key just made, with its secret."""

    key: str = Field(description="The key itself. It is shown only in this response.")
