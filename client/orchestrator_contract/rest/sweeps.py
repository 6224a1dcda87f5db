"""What ``/v1/sweeps`` and ``/v1/trials`` answer (the request body is ``orchestrator_contract.sweeps.SweepSpec``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field, field_validator

from orchestrator_contract.base import FromAttributes
from orchestrator_contract.rest.jobs import RunOut, StartupStageOut, startup_timeline
from orchestrator_contract.states import TrialState


class TrialOut(FromAttributes):
    """One trial of a sweep: a distributed training run with one point of the search space."""

    id: str = Field(description='Deploy its best checkpoint with a deployment source {"trial_id": id}.')
    sweep_id: str = Field(description="The sweep it belongs to.")
    number: int = Field(description="1, 2, ... in the order the search created the trials.")
    tune_id: str = Field(description="Ray Tune's id of the trial.")
    config: dict[str, Any] = Field(description="The searched values, by path into the base spec.")
    state: TrialState = Field(description="Where the trial is; STOPPED: stopped early by the scheduler.")
    reason: str = Field(description="Why it is in that state, as a code.")
    message: str = Field(description="The same, for people.")
    iterations: int = Field(description="Epochs run (reported).")
    latest_metrics: dict[str, Any] | None = Field(description="The last metrics it reported.")
    best_metric: float | None = Field(description="The sweep's metric at the trial's best epoch.")
    best_epoch: int | None = Field(description="The epoch of best_metric.")
    stopped_early: bool = Field(description="Stopped by the scheduler (ASHA) before its last epoch.")
    stragglers: list[dict[str, Any]] | None = Field(
        None,
        description="Ranks found slower than the others, each once (rank, ratio to the median, their time and the "
        "median's per step, the epoch and step): docs/jobs.md, Stragglers. A trial's only warn. Null: none.",
    )
    checkpoint_path: str | None = Field(
        description="The checkpoint of the best epoch (ties: the later) among those retention keeps: a folder that exists."
    )
    created_at: datetime = Field(description="When the search created it (UTC).")
    updated_at: datetime = Field(description="When the row last changed.")
    started_at: datetime | None = Field(None, description="When the sweep driver reported the trial running.")
    finished_at: datetime | None = Field(description="When it ended; null until then.")
    startup: list[StartupStageOut] = Field(
        default_factory=list,
        description="Its start-up timeline (docs/jobs.md, Start-up timeline): trial_started (Ray Tune started it) and "
        "first_result (its first epoch arrived), after_s from the first.",
    )

    @field_validator("startup", mode="before")
    @classmethod
    def _startup_column(cls, stages: Any) -> Any:
        if not isinstance(stages, dict):
            return stages or []
        (timeline,) = startup_timeline({"1": stages}) or [{"stages": []}]
        return timeline["stages"]


class TrialEventOut(FromAttributes):
    """One state change of a trial, oldest first: its creation (PENDING) and every transition."""

    from_state: TrialState | None = Field(description="Null for the first event (the creation).")
    to_state: TrialState = Field(description="The state it entered.")
    reason: str = Field(description="Why, as a code.")
    message: str = Field(description="Why, for people.")
    attempt: int = Field(description="The sweep's attempt it happened in.")
    created_at: datetime = Field(description="When (UTC).")


class BestTrialOut(BaseModel):
    """The best trial of a sweep so far."""

    id: str = Field(description="The trial's id (`GET /v1/trials/{id}`).")
    config: dict[str, Any] = Field(description="Its searched values.")
    metric: float = Field(description="The sweep's metric at its best epoch.")
    epoch: int | None = Field(description="That epoch.")
    checkpoint_path: str | None = Field(description="That epoch's checkpoint, while retention keeps it.")


class SweepOut(RunOut):
    """A hyperparameter sweep: one Ray Tune run whose trials are distributed training runs."""

    metric: str = Field(description="The metric the search optimizes.")
    mode: str = Field(description="'max' or 'min': which way the metric is better.")
    total_trials: int = Field(description="Trials the sweep runs in all.")
    trials: dict[str, int] = Field(description="How many trials are in each state.")
    best_trial: BestTrialOut | None = Field(description="The best trial so far by the sweep's metric.")


class TrialMetricOut(FromAttributes):
    """One epoch of a trial: what the search compared."""

    epoch: int = Field(description="The epoch.")
    step: int = Field(description="The optimizer step at its end.")
    values: dict[str, Any] = Field(description="Metric name to value.")
    checkpoint_path: str | None = Field(
        None,
        description="The epoch's checkpoint while retention keeps it (the trial's latest and best); null once deleted.",
    )
    created_at: datetime = Field(description="When it was recorded (UTC).")
