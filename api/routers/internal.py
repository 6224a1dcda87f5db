"""Endpoints for a job's (a sweep's) own driver and workers, authenticated by that run's token only (a driver's first
request, the claim, by its attempt's one-use claim code), checked before anything else about the request
(``api.run_auth``)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Annotated

from fastapi import APIRouter, Depends
from sqlalchemy.orm import Session

from api.deps import ControlPlaneDep, SessionDep
from api.run_auth import RunCaller
from orchestrator.backend import BackendUnavailable
from orchestrator.control_plane import ControlPlane
from orchestrator.db.models import Job, Sweep
from orchestrator.errors import Conflict
from orchestrator.limits import OverLimit, check_job_batch, check_sweep_batch
from orchestrator.repositories import sweeps as sweeps_repo
from orchestrator.services import bad_nodes, deadlines, hangs, reported_ends, run_claims, trial_hangs
from orchestrator.services.job_events import RefusedEvent, apply_events
from orchestrator.services.runs import JOBS, SWEEPS, RunKind
from orchestrator.services.sweep_events import apply_sweep_events
from orchestrator.states import startup
from orchestrator_contract.claims import ClaimedToken, DriverClaim
from orchestrator_contract.jobs import ControlSignal, DriverAssignment, EventBatch, JobSpec, TrainingPlan
from orchestrator_contract.sweeps import SweepAssignment, SweepEventBatch, SweepSpec, TrialEvent

log = logging.getLogger(__name__)
router = APIRouter(prefix="/internal/v1/jobs", tags=["internal"])
sweeps_router = APIRouter(prefix="/internal/v1/sweeps", tags=["internal"])

# The run of the path, if the request bears its token (a claim: its claim code); locked where the route writes.
JobCaller = Annotated[Job, Depends(RunCaller("job", Job, "job_id"))]
LockedJobCaller = Annotated[Job, Depends(RunCaller("job", Job, "job_id", lock=True))]
JobClaimant = Annotated[Job, Depends(RunCaller("job", Job, "job_id", lock=True, claim=True))]
SweepCaller = Annotated[Sweep, Depends(RunCaller("sweep", Sweep, "sweep_id"))]
LockedSweepCaller = Annotated[Sweep, Depends(RunCaller("sweep", Sweep, "sweep_id", lock=True))]
SweepClaimant = Annotated[Sweep, Depends(RunCaller("sweep", Sweep, "sweep_id", lock=True, claim=True))]


def _current_attempt(run: Job | Sweep, attempt: int) -> None:
    if attempt != run.attempt:
        raise Conflict(f"attempt {attempt} is stale: the run is on attempt {run.attempt}")


def _refusing_foreign(apply: Callable[[], int], session, run_id: str) -> int:
    """400 for a batch with an event no honest driver sends (nothing of it applied), logged: a driver that
    names another run's checkpoint is either broken or hostile. 422 for a batch past an input bound
    (``orchestrator.limits``), nothing of it applied either."""
    try:
        return apply()
    except OverLimit:  # a bound (docs/security.md, hole 6): said (an Invalid: 422), not logged as hostile
        session.rollback()
        raise
    except RefusedEvent as exc:  # a Refused: 400
        session.rollback()
        log.warning("refused events of run %s: %s", run_id, exc)
        raise


@router.get("/{job_id}/assignment", summary="A job driver's assignment (internal)")
def assignment(
    job_id: str, job: JobCaller, attempt: int, session: SessionDep, service: ControlPlaneDep
) -> DriverAssignment:
    """For the job's own driver (its run token): the spec, the plan and the storage path of this attempt, and
    the bad nodes its workers must avoid. A stale attempt is 409."""
    _current_attempt(job, attempt)
    answer = DriverAssignment(
        job_id=job.id,
        attempt=job.attempt,
        spec=JobSpec.model_validate(job.spec),
        plan=TrainingPlan.model_validate(job.plan),
        storage_path=service.storages.of(
            job.cluster, session
        ).storage_path,  # its cluster's storage_root, or the service's
        avoid_nodes=bad_nodes.nodes_to_avoid(session, service.settings, service.backends, job, JOBS.demand(job)),
    )
    _reached(session, JOBS, job.id, attempt, "assignment_fetched")
    return answer


@router.get("/{job_id}/control", summary="What the control plane asks of a running job (internal)")
def control(job_id: str, job: JobCaller, attempt: int) -> ControlSignal:
    """For the job's own ranks (its run token), polled while they train: ``checkpoint_now`` when the job is
    being preempted (``orchestrator.services.preemption``), ``stacks_wanted`` when it is suspected hung
    (``orchestrator.services.hangs``). A stale attempt is 409."""
    _current_attempt(job, attempt)
    return ControlSignal(
        checkpoint_now=job.preempt_requested_at is not None, stacks_wanted=hangs.stacks_request_id(job)
    )


@router.post("/{job_id}/events", summary="Report a job's events (internal)")
def post_events(
    job_id: str, job: LockedJobCaller, batch: EventBatch, session: SessionDep, service: ControlPlaneDep
) -> dict[str, int]:
    """For the job's own driver and rank 0 (its run token): state changes, metrics and committed checkpoints,
    applied in one transaction. Past a bound 422, an event no honest driver sends 400:
    nothing of the batch is applied then. A report of the job's end waits for Ray to confirm it
    (``orchestrator.services.reported_ends``): Ray is asked once here, after the commit."""
    _current_attempt(job, batch.attempt)
    applied = _refusing_foreign(
        lambda: (
            check_job_batch(job, batch, service.settings)
            or apply_events(
                session, job, batch, service.storages.of(job.cluster, session), service.settings.straggler_windows
            )
        ),
        session,
        job_id,
    )
    session.commit()
    if any(event.type == "checkpoint" for event in batch.events):
        # After the commit: storage is never touched with the job row (on SQLite, the database) locked.
        service.checkpoints.after_recording(job_id)
    _confirm_reported_end(session, service, JOBS, job)
    return {"received": len(batch.events), "applied": applied}


@sweeps_router.get("/{sweep_id}/assignment", summary="A sweep driver's assignment (internal)")
def sweep_assignment(
    sweep_id: str, sweep: SweepCaller, attempt: int, session: SessionDep, service: ControlPlaneDep
) -> SweepAssignment:
    """For the sweep's own driver (its run token): the spec and the storage path of this attempt, and the bad
    nodes its trials' workers must avoid."""
    _current_attempt(sweep, attempt)
    answer = SweepAssignment(
        sweep_id=sweep.id,
        attempt=sweep.attempt,
        spec=SweepSpec.model_validate(sweep.spec),
        storage_path=service.storages.of(sweep.cluster, session).storage_path,
        avoid_nodes=bad_nodes.nodes_to_avoid(session, service.settings, service.backends, sweep, SWEEPS.demand(sweep)),
    )
    _reached(session, SWEEPS, sweep.id, attempt, "assignment_fetched")
    return answer


def _reached(session: Session, kind: RunKind, run_id: str, attempt: int, stage: str) -> None:
    """The run's start-up timeline (``states.startup``): ``stage`` reached now, in a short transaction of its own
    (the assignment is read unlocked: finding the bad nodes asks Ray)."""
    session.commit()  # ends the read; the row is locked anew
    run = kind.lock(session, run_id)
    if run is not None and run.attempt == attempt:
        startup.mark(run, stage)
    session.commit()


@sweeps_router.get("/{sweep_id}/control", summary="What the control plane asks of a running sweep (internal)")
def sweep_control(sweep_id: str, sweep: SweepCaller, attempt: int, session: SessionDep) -> ControlSignal:
    """For the sweep's own driver and its trials' ranks (the sweep's run token), polled while it runs:
    ``checkpoint_now`` when the sweep is being preempted (``orchestrator.services.preemption``), ``stop_trials``
    those of its trials past their own deadline (``services.deadlines``), and its trials' hangs
    (``services.trial_hangs``). A stale attempt is 409."""
    _current_attempt(sweep, attempt)
    trials = sweeps_repo.running_trials(session, sweep.id)
    stacks_wanted, end_workers = trial_hangs.signal(trials)
    return ControlSignal(
        checkpoint_now=sweep.preempt_requested_at is not None,
        stop_trials=deadlines.trials_past_deadline(session, sweep, trials),
        trial_stacks_wanted=stacks_wanted,
        end_workers=end_workers,
    )


@sweeps_router.post("/{sweep_id}/events", summary="Report a sweep's events (internal)")
def post_sweep_events(
    sweep_id: str, sweep: LockedSweepCaller, batch: SweepEventBatch, session: SessionDep, service: ControlPlaneDep
) -> dict[str, int]:
    """For the sweep's own driver (its run token): the sweep's state changes and its trials' states, metrics
    and checkpoints, as for a job's events (its end too waits for Ray)."""
    _current_attempt(sweep, batch.attempt)
    applied = _refusing_foreign(
        lambda: (
            check_sweep_batch(batch, service.settings)
            or apply_sweep_events(
                session, sweep, batch, service.storages.of(sweep.cluster, session), service.settings.straggler_windows
            )
        ),
        session,
        sweep_id,
    )
    session.commit()
    with_checkpoints = {e.trial for e in batch.events if isinstance(e, TrialEvent) and e.checkpoint_path}
    if with_checkpoints:
        # After the commit, as for a job: storage is never touched with the sweep row locked.
        service.checkpoints.trials.after_recording(sweep_id, with_checkpoints)
    _confirm_reported_end(session, service, SWEEPS, sweep)
    return {"received": len(batch.events), "applied": applied}


@router.post("/{job_id}/claim", summary="A job driver's claim of its run token (internal)")
def claim(job_id: str, job: JobClaimant, body: DriverClaim, session: SessionDep) -> ClaimedToken:
    """For the job's driver, first thing (its attempt's claim code, which Ray lists: never the token): the run's
    token. Once per attempt, per driver: a second exchange, an old attempt's code or an ended run's is 401
    (``orchestrator.services.run_claims``)."""
    return _exchange(session, "job", job, body)


@sweeps_router.post("/{sweep_id}/claim", summary="A sweep driver's claim of its run token (internal)")
def sweep_claim(sweep_id: str, sweep: SweepClaimant, body: DriverClaim, session: SessionDep) -> ClaimedToken:
    """For the sweep's driver, as a job's (``claim``)."""
    return _exchange(session, "sweep", sweep, body)


def _exchange(session: Session, kind: str, run: Job | Sweep, body: DriverClaim) -> ClaimedToken:
    token = run_claims.exchange(kind, run, body.attempt, body.nonce)  # refused: nothing to commit
    startup.mark(run, "driver_started")  # its start-up timeline (states.startup)
    session.commit()
    return ClaimedToken(token=token)


def _confirm_reported_end(session: Session, service: ControlPlane, kind: RunKind, run: Job | Sweep) -> None:
    """A report of the run's end is applied at once when Ray already says its Ray job ended that way (a report
    that arrived after the driver exited); else the reconciler applies it after the driver exits. After the
    commit (the row is read as it was committed, no new transaction): Ray is never asked with the row (on
    SQLite, the database) locked."""
    if reported_ends.held(run) is None:
        return
    submission_id, attempt = run.submission_id, run.attempt
    try:
        info = service.backends.of(run).info(submission_id)  # its own cluster's Ray, never the run's word
    except BackendUnavailable:
        return  # the reconciler asks again
    if not info.status.finished:
        return
    locked = kind.lock(session, run.id)
    if (
        locked is not None
        and locked.attempt == attempt
        and reported_ends.apply_if_confirmed(session, kind, locked, info)
    ):
        session.commit()
    else:
        session.rollback()
