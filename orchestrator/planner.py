"""How a model fits and scales: memory per GPU under DDP and ZeRO 1/2/3 (FSDP), batch, LR, all-reduce.

Pure arithmetic, byte by byte. Units are decimal: 1 GB = 1e9 bytes.
"""

from __future__ import annotations

from orchestrator_contract import workloads
from orchestrator_contract.jobs import JobSpec, TrainingPlan, scale_lr
from orchestrator_contract.rest.plan import BytesPerParam, PlanRequest, PlanResponse, Strategy, StrategyFit

GB = 1e9
STRATEGIES: tuple[Strategy, ...] = ("ddp", "zero1", "zero2", "fsdp")
RUNNABLE: tuple[Strategy, ...] = ("ddp", "fsdp")  # what the training runtime runs


def bytes_per_param(precision: str, optimizer: str) -> BytesPerParam:
    """fp32 Adam: 4 + 4 + 8. Mixed-precision Adam: 2 + 2 + (4 master + 4 + 4). SGD with momentum: one
    moment instead of two."""
    moments = 8.0 if optimizer in ("adam", "adamw") else 4.0
    if precision == "fp32":
        return BytesPerParam(weights=4, gradients=4, optimizer=moments)
    return BytesPerParam(weights=2, gradients=2, optimizer=4 + moments)


def _sharding(strategy: Strategy) -> tuple[bool, bool, bool]:
    """Which of (weights, gradients, optimizer state) are divided over the GPUs."""
    return {
        "ddp": (False, False, False),
        "zero1": (False, False, True),
        "zero2": (False, True, True),
        "fsdp": (True, True, True),
    }[strategy]


def plan(request: PlanRequest) -> PlanResponse:
    params, n = float(request.params or 0), request.gpus
    per_param = bytes_per_param(request.precision, request.optimizer)
    strategies = {}
    for strategy in STRATEGIES:
        shard_w, shard_g, shard_o = _sharding(strategy)
        breakdown = {
            "weights": params * per_param.weights / (n if shard_w else 1) / GB,
            "gradients": params * per_param.gradients / (n if shard_g else 1) / GB,
            "optimizer": params * per_param.optimizer / (n if shard_o else 1) / GB,
            "activations": request.activation_gb,
        }
        total = sum(breakdown.values())
        strategies[strategy] = StrategyFit(
            per_gpu_gb=total, fits=total <= request.gpu_memory_gb, breakdown_gb=breakdown
        )

    fitting = [s for s in RUNNABLE if strategies[s].fits]
    recommended = fitting[0] if fitting else None
    best = strategies["fsdp"]
    shortfall = 0.0 if recommended else best.per_gpu_gb - request.gpu_memory_gb
    if recommended == "ddp":
        reason = f"ddp fits: {strategies['ddp'].per_gpu_gb:.3g} GB of {request.gpu_memory_gb:g} GB per GPU"
    elif recommended == "fsdp":
        reason = (
            f"ddp needs {strategies['ddp'].per_gpu_gb:.3g} GB per GPU, more than {request.gpu_memory_gb:g} GB; "
            f"fsdp over {n} GPUs needs {best.per_gpu_gb:.3g} GB"
        )
    else:
        reason = (
            f"does not fit: even fsdp over {n} GPUs needs {best.per_gpu_gb:.3g} GB per GPU, "
            f"{shortfall:.3g} GB more than {request.gpu_memory_gb:g} GB"
        )

    global_batch = request.per_gpu_batch * n * request.accumulation_steps
    gradient_bytes = params * per_param.gradients
    allreduce_s = 2 * (n - 1) / n * gradient_bytes / (request.bandwidth_gb_s * GB) + (n - 1) * request.latency_us * 1e-6
    return PlanResponse(
        params=params,
        bytes_per_param=per_param,
        strategies=strategies,
        recommended=recommended,
        reason=reason,
        shortfall_gb=shortfall,
        global_batch=global_batch,
        lr=scale_lr(request.base_lr, request.base_batch, global_batch, request.lr_scaling),
        allreduce_ms=allreduce_s * 1e3,
    )


class DoesNotFit(ValueError):
    pass


def plan_job(spec: JobSpec) -> TrainingPlan:
    """The plan recorded on a job at submit: the strategy that runs (``auto`` resolved), batch and LR."""
    common = {"global_batch": spec.global_batch, "lr": spec.scaled_lr}
    if spec.strategy != "auto":
        return TrainingPlan.fixed(spec)
    if spec.entrypoint is not None:
        return TrainingPlan(
            strategy="ddp",
            reason="training function: its model is unknown before it runs, so ddp (name fsdp to shard it)",
            **common,
        )
    descriptor = workloads.get(spec.workload or "")
    if descriptor is None or descriptor.param_count is None:
        which = "custom workload" if descriptor is None else f"workload {spec.workload}"
        return TrainingPlan(strategy="ddp", reason=f"{which}: its size is unknown before it runs, so ddp", **common)
    answer = plan(
        PlanRequest(
            workload=spec.workload,
            config=spec.config,
            precision=spec.precision,
            optimizer=spec.optimizer.name,
            gpus=spec.scaling.num_workers,
            gpu_memory_gb=spec.scaling.memory_per_worker_gb or 0.0,
        )
    )
    if answer.recommended is None:
        raise DoesNotFit(answer.reason)
    return TrainingPlan(strategy=answer.recommended, reason=f"planner: {answer.reason}", **common)
