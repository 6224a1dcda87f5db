"""What the jobs pages show of a job, built from the REST contract's own models (``JobOut`` and friends), so
the pages, their JSON and the REST API never disagree on a field."""

from __future__ import annotations

from typing import Any

from orchestrator import planner
from orchestrator.db.models import Checkpoint, Job, JobState
from orchestrator.errors import Invalid
from orchestrator.services.deployments import selection_metric
from orchestrator.services.downsample import finite
from orchestrator.states.jobs import TERMINAL
from orchestrator_contract import workloads
from orchestrator_contract.rest import CheckpointOut, JobEventOut, JobOut, PlanRequest

FAILED_LIKE = {JobState.FAILED}
WAITING = {JobState.QUEUED, JobState.STARTING, JobState.RESTARTING}


def why_class(state: JobState) -> str:
    """How a job's reason is shown: a failure in red, a wait in amber, anything else plainly."""
    if state in FAILED_LIKE:
        return "failed"
    if state in WAITING:
        return "waiting"
    return ""


def job_row(job: Job) -> dict[str, Any]:
    """One row of the jobs list (the page and its JSON)."""
    out = JobOut.model_validate(job)
    latest = out.latest_metrics or {}
    return {
        "id": out.id,
        "project_id": out.project_id,
        "name": out.name,
        "workload": out.workload,
        "state": out.state.value,
        "reason": out.reason,
        "message": out.message,
        "why": why_class(out.state),
        "attempt": out.attempt,
        "priority": out.priority,
        "labels": out.labels,
        "created_at": out.created_at,
        "finished_at": out.finished_at,
        "epoch": latest.get("epoch"),
        "step": latest.get("step"),
    }


def plan_view(job: Job) -> dict[str, Any]:
    """The plan recorded at submit (strategy and why, global batch, scaled LR) and the planner's memory estimate
    per GPU for the strategy that runs (built-in workloads whose size is known; None otherwise)."""
    plan = dict(job.plan or {})
    spec = job.spec or {}
    scaling = spec.get("scaling") or {}
    view: dict[str, Any] = {
        "strategy": plan.get("strategy"),
        "reason": plan.get("reason", ""),
        "global_batch": plan.get("global_batch"),
        "lr": plan.get("lr"),
        "base_lr": (spec.get("optimizer") or {}).get("lr"),
        "workers": scaling.get("num_workers"),
        "use_gpu": scaling.get("use_gpu"),
        "precision": spec.get("precision"),
        "memory_gb": None,
        "memory_limit_gb": scaling.get("memory_per_worker_gb"),
    }
    descriptor = workloads.get(job.workload)
    if descriptor is None or descriptor.param_count is None or plan.get("strategy") not in ("ddp", "fsdp"):
        return view
    try:
        answer = planner.plan(
            PlanRequest(
                workload=job.workload,
                config=spec.get("config") or {},
                precision=spec.get("precision", "bf16"),
                optimizer=(spec.get("optimizer") or {}).get("name", "adam"),
                gpus=scaling.get("num_workers", 1),
                gpu_memory_gb=scaling.get("memory_per_worker_gb") or 1e6,
            )
        )
    except (ValueError, TypeError):  # a spec from an older version the planner no longer reads
        return view
    view["memory_gb"] = answer.strategies[plan["strategy"]].per_gpu_gb
    view["params"] = answer.params
    return view


def best_checkpoint_id(job: Job, checkpoints: list[Checkpoint]) -> int | None:
    """The checkpoint a deployment of the job's "best" would take (``deployments.selection_metric``)."""
    try:
        metric, higher = selection_metric(job)
    except Invalid:  # SpecRejected: a training function with no keep_best metric: no "best" to mark
        return None
    scored = [(finite((c.metrics or {}).get(metric)), c.id) for c in checkpoints]
    scored = [(value, cid) for value, cid in scored if value is not None]
    if not scored:
        return None
    return (max if higher else min)(scored)[1]


def job_summary(job: Job, events: list, checkpoints: list[Checkpoint]) -> dict[str, Any]:
    """What a job's page shows and polls (``/ui/api/jobs/{id}``): the job, every event, the checkpoints."""
    out = JobOut.model_validate(job)
    latest = out.latest_metrics or {}
    result = out.result or {}
    best = best_checkpoint_id(job, checkpoints)
    return {
        "job": {
            **job_row(job),
            "started_at": out.started_at,
            "terminal": out.state in TERMINAL,
            "latest_metrics": latest,
            "result": result,
            "samples_per_s": latest.get("samples_per_s", (result.get("metrics") or result).get("samples_per_s")),
            "stragglers": out.stragglers or [],
            "cluster": out.cluster,  # the Ray cluster it runs on (docs/clusters.md); None until admitted
            # The latest attempt's start-up timeline (docs/jobs.md "Start-up timeline"); None before admission.
            "startup": out.startup[-1].model_dump(mode="json") if out.startup else None,
        },
        "events": [JobEventOut.model_validate(e).model_dump(mode="json") for e in events],
        "checkpoints": [
            {**CheckpointOut.model_validate(c).model_dump(mode="json"), "best": c.id == best} for c in checkpoints
        ],
        "best_checkpoint_id": best,
    }
