"""Usage accounting: ``GET /v1/usage`` (what is counted: docs/usage.md)."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from orchestrator_contract.rest.jobs import GoodputOut

GROUP_BY_DESCRIPTION = "project, job (a run: job, sweep or deployment), label:<key> (jobs' label value), or day (UTC)."
LABEL_KEY = re.compile(r"^[A-Za-z0-9_.\-/]{1,63}$")
# The CSV columns, in order: a row's identity, then its amounts.
CSV_COLUMNS = (
    "key",
    "kind",
    "name",
    "project_id",
    "seconds",
    "worker_seconds",
    "cpu_seconds",
    "gpu_seconds",
    "memory_gb_seconds",
    "training_seconds",
    "wasted_seconds",
    "wasted_cpu_seconds",
    "wasted_gpu_seconds",
)


class UsageAmounts(BaseModel):
    """What was held inside the window: wall-clock seconds of held stretches, and those seconds times what was
    held (workers or replicas x per-worker CPUs, GPUs, memory GB). ``wasted_*``: the part lost to failures and
    preemption (repeated from the last checkpoint); ``training_seconds`` is the rest."""

    seconds: float = Field(0.0, description="Held wall-clock seconds, summed over stretches (runs add up).")
    worker_seconds: float = Field(0.0, description="Workers (deployments: replicas) x seconds.")
    cpu_seconds: float = 0.0
    gpu_seconds: float = 0.0
    memory_gb_seconds: float = Field(0.0, description="Memory GB x seconds, from the spec's memory_per_worker_gb.")
    training_seconds: float = Field(0.0, description="seconds - wasted_seconds.")
    wasted_seconds: float = Field(0.0, description="Held seconds lost to failures and preemption.")
    wasted_cpu_seconds: float = 0.0
    wasted_gpu_seconds: float = 0.0


class UsageAttempt(UsageAmounts):
    """One attempt of a job (one sweep attempt's trial, one deployment version) within the window."""

    attempt: int = Field(description="The job's (or sweep's) attempt; a deployment's version.")
    ended: str = Field(description="The state that ended its last stretch; empty while it still holds.")
    reason: str = Field(description="Why it ended (the history row's reason).")


class UsageTrial(UsageAmounts):
    """One trial of a sweep (``group_by=job``)."""

    trial_id: str


class UsageRow(UsageAmounts):
    """One group of the report."""

    key: str = Field(description="The group: a project id, a run id, a label value ('' unlabelled) or a date.")
    kind: Literal["project", "job", "sweep", "deployment", "label", "day"]
    name: str = Field("", description="The project's or run's name; empty for labels and days.")
    project_id: str | None = Field(None, description="The project (group_by project and job).")
    attempts: list[UsageAttempt] | None = Field(None, description="group_by=job: per attempt (version), in order.")
    trials: list[UsageTrial] | None = Field(None, description="group_by=job, sweeps: per trial.")
    goodput: GoodputOut | None = Field(
        None,
        description="The group's jobs' goodput inside the window (docs/jobs.md \"Goodput\"): their kept training "
        "time over the time they held workers, and the lost time by cause; null where the group holds no job "
        "(sweeps and deployments have none).",
    )


class UsageReport(BaseModel):
    """``GET /v1/usage``: every stretch of held resources, clipped to [from, to), grouped; a stretch still
    held counts up to ``generated_at``."""

    from_: datetime = Field(alias="from", description="The window's start (inclusive, UTC).")
    to: datetime = Field(description="The window's end (exclusive, UTC).")
    group_by: str = Field(description=GROUP_BY_DESCRIPTION)
    project_id: str | None = Field(description="The project reported; null: every project (cluster-wide admins).")
    generated_at: datetime = Field(description="Now: stretches still held count up to here.")
    rows: list[UsageRow]
    total: UsageAmounts = Field(description="The sum of the rows.")
    goodput: GoodputOut | None = Field(None, description="Every job's goodput inside the window, summed; null: no job.")

    # "from" is a Python keyword: the field is from_, and it reads and writes as "from" everywhere.
    model_config = ConfigDict(validate_by_name=True, validate_by_alias=True, serialize_by_alias=True)
