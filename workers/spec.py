"""The wire contract between the control plane and the code that runs on the Ray cluster.

Everything here is plain pydantic so that both sides (``orchestrator`` and ``workers``) can import it
without torch or ray. The control plane validates a submitted spec with these models; the driver
receives the same JSON back and parses it with the same models.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationInfo, field_validator, model_validator

# A custom workload names a function inside an installed package: "package.module:function".
CUSTOM_WORKLOAD_PATTERN = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*$")
LABEL_KEY = r"^[A-Za-z0-9]([A-Za-z0-9_.\-/]{0,61}[A-Za-z0-9])?$"
LABEL_VALUE = r"^[A-Za-z0-9_.\-]{0,63}$"


class _Strict(BaseModel):
    """Unknown keys are an error: a typo in a spec must never be silently ignored."""

    model_config = ConfigDict(extra="forbid")


# --- built-in workload configs -------------------------------------------------------------------


class DigitsConfig(_Strict):
    """Hyperparameters of the built-in ``digits`` workload (scikit-learn's bundled 8x8 digits)."""

    epochs: int = Field(12, ge=1, le=1000, description="Passes over the training split.")
    lr: float = Field(0.05, gt=0, le=10, description="SGD learning rate.")
    momentum: float = Field(0.9, ge=0, lt=1)
    batch_size: int = Field(32, ge=1, le=4096, description="Per-worker batch size.")
    hidden: int = Field(128, ge=1, le=8192, description="Width of the hidden layer.")
    val_fraction: float = Field(0.2, gt=0, lt=1, description="Share of the data held out.")
    seed: int = Field(0, ge=0, description="Seed for the split, the init and the sampler.")


# Built-in workloads by name, with the model that validates their ``config``.
BUILTIN_WORKLOADS: dict[str, type[BaseModel]] = {"digits": DigitsConfig}


def is_custom_workload(workload: str) -> bool:
    return bool(CUSTOM_WORKLOAD_PATTERN.match(workload))


# --- job spec --------------------------------------------------------------------------------------


class ScalingSpec(_Strict):
    num_workers: int = Field(2, ge=1, le=1024, description="Training workers (one Ray Train actor each).")
    use_gpu: bool = False
    cpus_per_worker: float = Field(1.0, gt=0, le=512)
    gpus_per_worker: float | None = Field(
        None, ge=0, le=16, description="Defaults to 1 when use_gpu is set, else 0."
    )

    @model_validator(mode="after")
    def _gpu_defaults(self) -> ScalingSpec:
        if self.gpus_per_worker is None:
            self.gpus_per_worker = 1.0 if self.use_gpu else 0.0
        elif self.gpus_per_worker > 0 and not self.use_gpu:
            raise ValueError("gpus_per_worker > 0 needs use_gpu: true")
        elif self.use_gpu and self.gpus_per_worker == 0:
            raise ValueError("use_gpu: true needs gpus_per_worker > 0")
        return self

    def total_resources(self) -> dict[str, float]:
        """What the whole worker group asks of the cluster, all at once."""
        return {
            "CPU": self.num_workers * self.cpus_per_worker,
            "GPU": self.num_workers * (self.gpus_per_worker or 0.0),
        }


class CheckpointSpec(_Strict):
    every_epochs: int = Field(1, ge=1, le=10_000, description="Checkpoint every N epochs (and at the end).")
    keep: int = Field(2, ge=1, le=1000, description="Most recent checkpoints kept in storage.")


class RetrySpec(_Strict):
    max_worker_restarts: int = Field(
        2, ge=0, le=100, description="Worker-group restarts Ray Train may make within one attempt."
    )
    max_attempts: int = Field(3, ge=1, le=100, description="Driver attempts the control plane may make.")


LabelKey = Annotated[str, StringConstraints(pattern=LABEL_KEY)]
LabelValue = Annotated[str, StringConstraints(pattern=LABEL_VALUE)]


class JobSpec(_Strict):
    """What a user submits to ``POST /v1/jobs``. Only ``workload`` is required."""

    name: str = Field("", max_length=128, description="Free-form display name.")
    workload: str = Field(
        description='A built-in workload ("digits") or "package.module:function" from an allowed package.'
    )
    config: dict[str, Any] = Field(
        default_factory=dict, validate_default=True, description="The workload's hyperparameters."
    )
    scaling: ScalingSpec = Field(default_factory=ScalingSpec)
    strategy: Literal["ddp"] = "ddp"
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    retries: RetrySpec = Field(default_factory=RetrySpec)
    priority: int = Field(0, ge=-1000, le=1000, description="Higher runs first; ties go oldest first.")
    labels: dict[LabelKey, LabelValue] = Field(default_factory=dict, max_length=32)

    @field_validator("workload")
    @classmethod
    def _known_workload(cls, workload: str) -> str:
        if workload in BUILTIN_WORKLOADS or is_custom_workload(workload):
            return workload
        raise ValueError(
            f"unknown workload {workload!r}: use one of {sorted(BUILTIN_WORKLOADS)} "
            'or "package.module:function"'
        )

    @field_validator("config")
    @classmethod
    def _validate_builtin_config(cls, config: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        # Fill in and check a built-in workload's hyperparameters (errors keep their config.* location),
        # so that the stored spec is the complete one the job really runs with.
        config_model = BUILTIN_WORKLOADS.get(info.data.get("workload", ""))
        if config_model is None:
            return config
        return config_model.model_validate(config).model_dump()


# --- what the driver receives -----------------------------------------------------------------------


class DriverAssignment(BaseModel):
    """``GET /internal/v1/jobs/{id}/assignment``: everything a driver needs to run one attempt."""

    job_id: str
    attempt: int
    spec: JobSpec
    storage_path: str = Field(description="Ray Train storage_path; the run's folder is <storage_path>/<job_id>.")


# --- events the cluster reports back ----------------------------------------------------------------


class StateEvent(_Strict):
    type: Literal["state"] = "state"
    state: Literal["running", "succeeded", "failed"]
    reason: str = Field("", max_length=64)
    message: str = Field("", max_length=20_000)
    result: dict[str, Any] | None = None


class MetricsEvent(_Strict):
    type: Literal["metrics"] = "metrics"
    epoch: int = Field(ge=0)
    step: int = Field(ge=0)
    values: dict[str, float]


class CheckpointEvent(_Strict):
    type: Literal["checkpoint"] = "checkpoint"
    epoch: int = Field(ge=0)
    step: int = Field(ge=0)
    path: str = Field(min_length=1, max_length=4096)
    size_bytes: int = Field(ge=0)
    metrics: dict[str, float] = Field(default_factory=dict)


Event = Annotated[StateEvent | MetricsEvent | CheckpointEvent, Field(discriminator="type")]


class EventBatch(_Strict):
    """``POST /internal/v1/jobs/{id}/events``. Events are idempotent: a retried batch changes nothing."""

    attempt: int = Field(ge=1)
    events: list[Event] = Field(max_length=1000)
