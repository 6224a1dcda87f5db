"""Response and request bodies of the public API (the job spec itself is ``workers.spec.JobSpec``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.db.models import Job, JobState, Role


class _FromORM(BaseModel):
    model_config = ConfigDict(from_attributes=True)


class ProjectCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=64, pattern=r"^[a-z0-9][a-z0-9_-]*$")


class ProjectOut(_FromORM):
    id: str
    name: str
    created_at: datetime


class KeyCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Role
    name: str = Field("", max_length=64)


class KeyOut(_FromORM):
    id: str
    project_id: str
    name: str
    role: Role
    prefix: str
    created_at: datetime


class KeyCreated(KeyOut):
    key: str = Field(description="The key itself. It is shown only in this response.")


class JobOut(_FromORM):
    id: str
    project_id: str
    name: str
    workload: str
    state: JobState
    reason: str
    message: str
    attempt: int
    priority: int
    labels: dict[str, str]
    spec: dict[str, Any]
    plan: dict[str, Any] | None = Field(description="Strategy that runs (auto resolved, with the reason), global batch, scaled LR.")
    latest_metrics: dict[str, Any] | None
    result: dict[str, Any] | None
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None

    @classmethod
    def of(cls, job: Job) -> JobOut:
        data = {name: getattr(job, name) for name in cls.model_fields if name != "labels"}
        return cls(**data, labels={label.key: label.value for label in job.labels})


class JobPage(BaseModel):
    items: list[JobOut]
    next_cursor: str | None = Field(description="Pass as ?cursor= for the next page; null on the last.")


class JobEventOut(_FromORM):
    from_state: JobState | None
    to_state: JobState
    reason: str
    message: str
    attempt: int
    created_at: datetime


class MetricOut(_FromORM):
    attempt: int
    epoch: int
    step: int
    values: dict[str, Any]
    created_at: datetime


class CheckpointOut(_FromORM):
    attempt: int
    epoch: int
    step: int
    path: str
    size_bytes: int
    metrics: dict[str, Any]
    created_at: datetime
