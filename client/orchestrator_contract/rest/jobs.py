"""What ``/v1/jobs`` answers (the request body is ``orchestrator_contract.jobs.JobSpec``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field, field_validator

from orchestrator_contract.base import FromAttributes
from orchestrator_contract.jobs import STARTUP_STAGES, TRIAL_STAGES
from orchestrator_contract.states import JobState


class StartupStageOut(BaseModel):
    """One stage of an attempt's start."""

    stage: str = Field(description="Its name (docs/jobs.md, Start-up timeline), in the order stages happen.")
    at: datetime = Field(description="When it was reached, by the control plane's clock (UTC).")
    after_s: float = Field(description="Seconds since the attempt's first stage (admitted).")


class StartupOut(BaseModel):
    """An attempt's start-up timeline: where the seconds from its admission to its first step went."""

    attempt: int = Field(description="The attempt.")
    stages: list[StartupStageOut] = Field(description="The stages reached so far, in order.")
    first_step_s: float | None = Field(description="Seconds from admitted to first_step; null until then.")


def startup_timeline(attempts: Any) -> Any:
    """A run row's ``startup`` column (``{attempt: {stage: ISO time}}``) as ``StartupOut`` values, oldest attempt
    first, each attempt's stages in the order of ``STARTUP_STAGES`` (then by time)."""
    if not isinstance(attempts, dict):
        return attempts or []
    order = {stage: index for index, stage in enumerate(STARTUP_STAGES + TRIAL_STAGES)}
    timelines = []
    for attempt, stages in sorted(attempts.items(), key=lambda item: int(item[0])):
        times = sorted(
            ((name, datetime.fromisoformat(at)) for name, at in stages.items()),
            key=lambda item: (order.get(item[0], len(order)), item[1]),
        )
        start = times[0][1] if times else None
        rows = [{"stage": name, "at": at, "after_s": round((at - start).total_seconds(), 3)} for name, at in times]
        first = next((row["after_s"] for row in rows if row["stage"] == "first_step"), None)
        timelines.append({"attempt": int(attempt), "stages": rows, "first_step_s": first})
    return timelines


class RunOut(FromAttributes):
    """What a job and a sweep both have: one Ray job per attempt, through the same lifecycle."""

    id: str = Field(description="The run's id.")
    project_id: str = Field(description="The project it runs in.")
    name: str = Field(description="The name given in the spec ('' if none).")
    workload: str = Field(
        description="A built-in workload's name, or 'package.module:function'; for a training function's job, "
        "its entrypoint (the spec says which)."
    )
    cluster: str | None = Field(
        None,
        description="The Ray cluster it runs on (docs/clusters.md): chosen when it is first admitted and kept for "
        "every later attempt; null until then (and on runs from before clusters: the default cluster).",
    )
    state: JobState = Field(description="Where it is in its lifecycle; terminal states are final.")
    reason: str = Field(description="Why it is in that state, as a code (e.g. insufficient_resources, worker_died).")
    message: str = Field(description="The same, for people.")
    attempt: int = Field(description="1 for the first Ray job, one more for each resubmission; 0 until admitted.")
    preemptions: int = Field(
        0,
        description="Times it was preempted and requeued; the attempts that followed are not counted against "
        "retries.max_attempts (attempt - preemptions are).",
    )
    last_preempted_at: datetime | None = Field(
        None,
        description="When it was last preempted (went back to QUEUED, reason preempted); null if it never was. "
        "Kept once its reason moves on to what it waits for now.",
    )
    last_preempted_by: str = Field(
        "",
        description="By whom and why it was last preempted: a run of its own project by id and priority, e.g. "
        "'job 1f2e (priority 10) (priority)'; another project's only as 'a run of another project (quota)' "
        "(or '(fair_share)'); '' if never.",
    )
    borrowing: bool = Field(
        False,
        description="Its current attempt was admitted on idle capacity beyond its project's quota "
        "(docs/scheduling.md): the first to be preempted when that capacity is wanted back.",
    )
    priority: int = Field(description="Higher is admitted first.")
    spec: dict[str, Any] = Field(description="The spec as stored: what was sent, every default filled in.")
    created_at: datetime = Field(description="When it was submitted (UTC).")
    updated_at: datetime = Field(description="When the row last changed.")
    started_at: datetime | None = Field(description="When it first ran; null until then.")
    finished_at: datetime | None = Field(description="When it reached a terminal state; null until then.")
    startup: list[StartupOut] = Field(
        default_factory=list,
        description="Each attempt's start-up timeline, oldest first: when each stage of its start was reached, from "
        "its admission to its first training step (docs/jobs.md, Start-up timeline).",
    )

    @field_validator("startup", mode="before")
    @classmethod
    def _startup_column(cls, attempts: Any) -> Any:
        return startup_timeline(attempts)


class JobOut(RunOut):
    """A training job."""

    labels: dict[str, str] = Field(description="The spec's labels (`GET /v1/jobs?label=key=value` filters on them).")
    plan: dict[str, Any] | None = Field(
        description="Strategy that runs (auto resolved, with the reason), global batch, scaled LR."
    )
    latest_metrics: dict[str, Any] | None = Field(description="The last metrics reported (with epoch and step).")
    stragglers: list[dict[str, Any]] | None = Field(
        None,
        description="Ranks of the current attempt found slower than the others (rank, ratio to the median, their "
        "time and the median's per step, the step): docs/jobs.md, Stragglers. Null: none.",
    )
    result: dict[str, Any] | None = Field(
        description="What the driver reported with its final state (final metrics, checkpoint); null until then."
    )

    @field_validator("labels", mode="before")
    @classmethod
    def _label_rows(cls, labels: Any) -> Any:
        """Label rows (anything with ``key`` and ``value``), as read from the database, become a mapping."""
        if isinstance(labels, list | tuple):
            return {label.key: label.value for label in labels}
        return labels


class JobPage(FromAttributes):
    """One page of ``GET /v1/jobs``."""

    items: list[JobOut] = Field(description="Newest first.")
    next_cursor: str | None = Field(description="Pass as ?cursor= for the next page; null on the last.")


class JobEventOut(FromAttributes):
    """One state change of a job (or a sweep): the history, oldest first."""

    from_state: JobState | None = Field(description="Null for the first event (the submission).")
    to_state: JobState = Field(description="The state it entered.")
    reason: str = Field(description="Why, as a code.")
    message: str = Field(description="Why, for people.")
    attempt: int = Field(description="The attempt it happened in.")
    created_at: datetime = Field(description="When (UTC).")


class MetricOut(FromAttributes):
    """One metrics report of a job's rank 0."""

    attempt: int = Field(description="The attempt that reported it.")
    epoch: int = Field(description="The epoch it was reported in.")
    step: int = Field(description="The optimizer step it was reported at.")
    values: dict[str, Any] = Field(description="Metric name to value.")
    created_at: datetime = Field(description="When it was recorded (UTC).")


class CheckpointOut(FromAttributes):
    """A committed checkpoint of a job (one retention keeps)."""

    id: int = Field(description='Deploy exactly this checkpoint with a deployment source {"checkpoint_id": id}.')
    attempt: int = Field(description="The attempt that wrote it.")
    epoch: int = Field(description="The epoch it was written after.")
    step: int = Field(description="The optimizer step it holds.")
    path: str = Field(description="Its folder in the storage path.")
    size_bytes: int = Field(description="Its size on storage.")
    metrics: dict[str, Any] = Field(description="The metrics reported with it.")
    created_at: datetime = Field(description="When it was committed (UTC).")


class LostTime(BaseModel):
    """Where the held time that was not kept training went, in seconds (docs/jobs.md "Goodput")."""

    start_up_s: float = Field(description="STARTING: the Ray job submitted, its workers placed, its code set up.")
    restarts_s: float = Field(description="RESTARTING: a worker group or a driver being replaced.")
    hangs_s: float = Field(description="Attempts ended hung: from their last report to their end.")
    recomputed_s: float = Field(
        description="Training after the last committed checkpoint of a stretch that ended short (a restart, a "
        "preemption, a failure): redone by the next attempt, or lost."
    )
    preemption_s: float = Field(description="From a preemption's (or a deadline's) ask to the stop.")
    checkpoint_blocking_s: float = Field(
        0.0,
        description="Training stopped while a kept checkpoint was taken (a synchronous write, or an asynchronous "
        "one's snapshot), as the run's rank 0 measured it.",
    )


class GoodputOut(BaseModel):
    """``GET /v1/jobs/{id}/goodput``: kept training time over the time the job held its workers."""

    goodput: float | None = Field(description="kept_s / held_s; null before it held anything.")
    held_s: float = Field(description="Seconds STARTING, RUNNING, RESTARTING or CANCELLING (an active job: until now).")
    running_s: float = Field(description="Seconds RUNNING.")
    kept_s: float = Field(description="RUNNING less hangs, recomputed and preemption.")
    lost: LostTime
