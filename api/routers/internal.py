"""Endpoints for a job's own driver and workers, authenticated by that job's token only."""

from __future__ import annotations


from fastapi import APIRouter, HTTPException, status

from api.deps import BearerDep, ServiceDep, SessionDep
from orchestrator.auth import hash_secret, secrets_equal
from orchestrator.db.models import Job
from orchestrator.services.events import apply_events
from orchestrator.states import lock_job
from workers.spec import DriverAssignment, EventBatch, JobSpec, TrainingPlan

router = APIRouter(prefix="/internal/v1/jobs", tags=["internal"])


def _check_token(job: Job | None, credentials) -> Job:
    # The same answer for an unknown job and a wrong token: a token says nothing about other jobs.
    if job is None or credentials is None or not job.token_hash or not secrets_equal(
        hash_secret(credentials.credentials), job.token_hash
    ):
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "not this job's token", headers={"WWW-Authenticate": "Bearer"})
    return job


def _current_attempt(job: Job, attempt: int) -> None:
    if attempt != job.attempt:
        raise HTTPException(
            status.HTTP_409_CONFLICT, f"attempt {attempt} is stale: the job is on attempt {job.attempt}"
        )


@router.get("/{job_id}/assignment")
def assignment(job_id: str, attempt: int, session: SessionDep, service: ServiceDep, credentials: BearerDep) -> DriverAssignment:
    job = _check_token(session.get(Job, job_id), credentials)
    _current_attempt(job, attempt)
    return DriverAssignment(
        job_id=job.id, attempt=job.attempt, spec=JobSpec.model_validate(job.spec),
        plan=TrainingPlan.model_validate(job.plan), storage_path=service.settings.storage_path,
    )


@router.post("/{job_id}/events")
def post_events(
    job_id: str, batch: EventBatch, session: SessionDep, service: ServiceDep, credentials: BearerDep
) -> dict[str, int]:
    job = _check_token(lock_job(session, job_id), credentials)
    _current_attempt(job, batch.attempt)
    applied = apply_events(session, job, batch)
    session.commit()
    if any(event.type == "checkpoint" for event in batch.events):
        # After the commit: storage is never touched with the job row (on SQLite, the database) locked.
        service.checkpoints.after_recording(job_id)
    return {"received": len(batch.events), "applied": applied}
