"""Endpoints for a job's (a sweep's) own driver and workers, authenticated by that run's token only."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from fastapi import APIRouter

from api.deps import BearerDep, ControlPlaneDep, SessionDep
from orchestrator.auth import hash_secret, secrets_equal
from orchestrator.db.models import Job, Sweep
from orchestrator.errors import Conflict, Unauthorized
from orchestrator.limits import OverLimit, check_job_batch, check_sweep_batch
from orchestrator.services.events import RefusedEvent, apply_events
from orchestrator.services.sweep_events import apply_sweep_events
from orchestrator.states.jobs import lock_job
from orchestrator.states.sweeps import lock_sweep
from workers.contract.jobs import ControlSignal, DriverAssignment, EventBatch, JobSpec, TrainingPlan
from workers.contract.sweeps import SweepAssignment, SweepEventBatch, SweepSpec, TrialEvent

log = logging.getLogger(__name__)
router = APIRouter(prefix="/internal/v1/jobs", tags=["internal"])
sweeps_router = APIRouter(prefix="/internal/v1/sweeps", tags=["internal"])
Run = TypeVar("Run", Job, Sweep)


def _check_token(run: Run | None, credentials) -> Run:
    # The same answer for an unknown run and a wrong token: a token says nothing about other runs.
    if (
        run is None
        or credentials is None
        or not run.token_hash
        or not secrets_equal(hash_secret(credentials.credentials), run.token_hash)
    ):
        raise Unauthorized("not this run's token")
    return run


def _current_attempt(run: Job | Sweep, attempt: int) -> None:
    if attempt != run.attempt:
        raise Conflict(f"attempt {attempt} is stale: the run is on attempt {run.attempt}")


def _refusing_foreign(apply: Callable[[], int], session, run_id: str) -> int:
    """400 for a batch with an event no honest driver sends (nothing of it applied), logged: a driver that
    names another run's checkpoint is either broken or hostile. 422 for a batch past an input bound
    (``orchestrator.limits``), nothing of it applied either."""
    try:
        return apply()
    except OverLimit:  # a bound (issue 15, hole 6): said (an Invalid: 422), not logged as hostile
        session.rollback()
        raise
    except RefusedEvent as exc:  # a Refused: 400
        session.rollback()
        log.warning("refused events of run %s: %s", run_id, exc)
        raise


@router.get("/{job_id}/assignment", summary="A job driver's assignment (internal)")
def assignment(
    job_id: str, attempt: int, session: SessionDep, service: ControlPlaneDep, credentials: BearerDep
) -> DriverAssignment:
    """For the job's own driver (its run token): the spec, the plan and the storage path of this attempt.
    A stale attempt is 409."""
    job = _check_token(session.get(Job, job_id), credentials)
    _current_attempt(job, attempt)
    return DriverAssignment(
        job_id=job.id,
        attempt=job.attempt,
        spec=JobSpec.model_validate(job.spec),
        plan=TrainingPlan.model_validate(job.plan),
        storage_path=service.settings.storage_path,
    )


@router.get("/{job_id}/control", summary="What the control plane asks of a running job (internal)")
def control(job_id: str, attempt: int, session: SessionDep, credentials: BearerDep) -> ControlSignal:
    """For the job's own rank 0 (its run token), polled while it trains: ``checkpoint_now`` when the job is
    being preempted (``orchestrator.services.preemption``). A stale attempt is 409."""
    job = _check_token(session.get(Job, job_id), credentials)
    _current_attempt(job, attempt)
    return ControlSignal(checkpoint_now=job.preempt_requested_at is not None)


@router.post("/{job_id}/events", summary="Report a job's events (internal)")
def post_events(
    job_id: str, batch: EventBatch, session: SessionDep, service: ControlPlaneDep, credentials: BearerDep
) -> dict[str, int]:
    """For the job's own driver and rank 0 (its run token): state changes, metrics and committed checkpoints,
    applied in one transaction. Past a bound 422, an event no honest driver sends 400:
    nothing of the batch is applied then."""
    job = _check_token(lock_job(session, job_id), credentials)
    _current_attempt(job, batch.attempt)
    applied = _refusing_foreign(
        lambda: (
            check_job_batch(job, batch, service.settings)
            or apply_events(session, job, batch, service.checkpoints.storage)
        ),
        session,
        job_id,
    )
    session.commit()
    if any(event.type == "checkpoint" for event in batch.events):
        # After the commit: storage is never touched with the job row (on SQLite, the database) locked.
        service.checkpoints.after_recording(job_id)
    return {"received": len(batch.events), "applied": applied}


@sweeps_router.get("/{sweep_id}/assignment", summary="A sweep driver's assignment (internal)")
def sweep_assignment(
    sweep_id: str, attempt: int, session: SessionDep, service: ControlPlaneDep, credentials: BearerDep
) -> SweepAssignment:
    """For the sweep's own driver (its run token): the spec and the storage path of this attempt."""
    sweep = _check_token(session.get(Sweep, sweep_id), credentials)
    _current_attempt(sweep, attempt)
    return SweepAssignment(
        sweep_id=sweep.id,
        attempt=sweep.attempt,
        spec=SweepSpec.model_validate(sweep.spec),
        storage_path=service.settings.storage_path,
    )


@sweeps_router.get("/{sweep_id}/control", summary="What the control plane asks of a running sweep (internal)")
def sweep_control(sweep_id: str, attempt: int, session: SessionDep, credentials: BearerDep) -> ControlSignal:
    """For the sweep's own driver and its trials' rank 0 (the sweep's run token), polled while it runs:
    ``checkpoint_now`` when the sweep is being preempted (``orchestrator.services.preemption``). A stale
    attempt is 409."""
    sweep = _check_token(session.get(Sweep, sweep_id), credentials)
    _current_attempt(sweep, attempt)
    return ControlSignal(checkpoint_now=sweep.preempt_requested_at is not None)


@sweeps_router.post("/{sweep_id}/events", summary="Report a sweep's events (internal)")
def post_sweep_events(
    sweep_id: str, batch: SweepEventBatch, session: SessionDep, service: ControlPlaneDep, credentials: BearerDep
) -> dict[str, int]:
    """For the sweep's own driver (its run token): the sweep's state changes and its trials' states, metrics
    and checkpoints, as for a job's events."""
    sweep = _check_token(lock_sweep(session, sweep_id), credentials)
    _current_attempt(sweep, batch.attempt)
    applied = _refusing_foreign(
        lambda: (
            check_sweep_batch(batch, service.settings)
            or apply_sweep_events(session, sweep, batch, service.checkpoints.storage)
        ),
        session,
        sweep_id,
    )
    session.commit()
    with_checkpoints = {e.trial for e in batch.events if isinstance(e, TrialEvent) and e.checkpoint_path}
    if with_checkpoints:
        # After the commit, as for a job: storage is never touched with the sweep row locked.
        service.checkpoints.trials.after_recording(sweep_id, with_checkpoints)
    return {"received": len(batch.events), "applied": applied}
