"""POST /v1/plan: how a model fits and scales (``orchestrator.planner`` does the arithmetic)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from orchestrator_contract import workloads
from orchestrator_contract.jobs import LrScaling

Strategy = Literal["ddp", "zero1", "zero2", "fsdp"]


class BytesPerParam(BaseModel):
    weights: float
    gradients: float
    optimizer: float = Field(description="Master weights (mixed precision) plus the optimizer's moments.")

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer


class PlanRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # Upper bounds keep every figure of the answer a finite number (JSON has no infinity).
    params: float | None = Field(None, gt=0, le=1e15, description="Parameter count; or give workload + config.")
    workload: str | None = Field(None, description="A built-in workload whose parameters are counted.")
    config: dict = Field(default_factory=dict)
    precision: Literal["fp32", "bf16", "fp16"] = "bf16"
    optimizer: Literal["sgd", "adam", "adamw"] = "adam"
    gpus: int = Field(1, ge=1, le=100_000)
    gpu_memory_gb: float = Field(ge=0.001, le=1e6)
    activation_gb: float = Field(0.0, ge=0, le=1e6)
    per_gpu_batch: int = Field(1, ge=1, le=10_000_000)
    accumulation_steps: int = Field(1, ge=1, le=1_000_000)
    base_lr: float = Field(1e-3, gt=0, le=1e3)
    base_batch: int = Field(1, ge=1, le=1_000_000_000)
    lr_scaling: LrScaling = "linear"
    bandwidth_gb_s: float = Field(25.0, ge=0.001, le=1e6, description="Per-GPU all-reduce bandwidth.")
    latency_us: float = Field(5.0, ge=0, le=1e9, description="Per-hop latency.")

    @model_validator(mode="after")
    def _params_or_workload(self) -> PlanRequest:
        if (self.params is None) == (self.workload is None):
            raise ValueError("give either params or workload (+ config), not both")
        if self.workload is not None:
            descriptor = workloads.get(self.workload)
            if descriptor is None or descriptor.param_count is None:
                raise ValueError(
                    f"workload {self.workload!r}: the planner counts parameters of {countable_workloads()} only"
                )
            self.params = float(descriptor.count_params(self.config) or 0)
        return self


def countable_workloads() -> list[str]:
    """The workloads whose parameters the planner can count before they run (their descriptor's hint)."""
    return [name for name in workloads.names() if workloads.get(name).param_count is not None]


class StrategyFit(BaseModel):
    per_gpu_gb: float
    fits: bool
    breakdown_gb: dict[str, float] = Field(description="weights, gradients, optimizer, activations per GPU.")


class PlanResponse(BaseModel):
    params: float
    bytes_per_param: BytesPerParam
    strategies: dict[Strategy, StrategyFit]
    recommended: Strategy | None
    reason: str
    shortfall_gb: float = Field(description="How much more memory per GPU the best runnable strategy needs.")
    global_batch: int
    lr: float
    allreduce_ms: float
