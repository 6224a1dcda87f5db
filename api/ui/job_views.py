"""What the jobs pages show of a job, built from the REST contract's own models (``JobOut`` and friends), so
the pages, their JSON and the REST API never disagree on a field."""

from __future__ import annotations

from typing import Any

from orchestrator.db.models import Job, JobState
from workers.contract.rest import JobOut

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
