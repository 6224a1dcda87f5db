"""Usage accounting hooks (docs/usage.md): the state engine writes the ledger (``usage_intervals``) as runs change
state, in the transition's own transaction, at the transition's own instant (``Change.at``, which is also
the history row's ``created_at``). ``orchestrator.usage`` reads it back.

What is held, and when
    job         from entering RUNNING until leaving RUNNING and CANCELLING (the worker group is up and
                training; a cancel stops it). STARTING and RESTARTING are not counted: the driver is starting
                or the worker group is being placed again, and Ray may not hold the workers yet.
                Held: ``num_workers`` x ``cpus_per_worker`` / ``gpus_per_worker`` / ``memory_per_worker_gb``
                of the stored spec (the memory is the spec's figure, its default filled in: 4 GB a worker
                on CPU, 16 with GPUs; Ray itself reserves no memory for a worker).
    trial       from RUNNING to its end, with the trial's own scaling (the sweep's base with the trial's
                config applied).
    deployment  from creation (DEPLOYING) or admission (QUEUED -> DEPLOYING) until FAILED or DELETED; a new
                stretch at every transition, with the replicas and per-replica CPUs/GPUs of the version being
                served (a rollout: the new version; HEALTHY, UNHEALTHY, and QUEUED while an older version keeps
                serving: the live version). An autoscaled version counts its ``min``. A QUEUED deployment with
                no live version holds nothing.

Wasted time: a job stretch that ended other than SUCCEEDED or CANCELLED (RESTARTING after a failure,
FAILED, back to QUEUED when preempted) is wasted from the last checkpoint committed during it to its end,
or wholly when it committed none: that work is repeated (or lost) when the run resumes from its latest
checkpoint. A trial likewise when it ends FAILED. Deployments waste nothing.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from orchestrator.db.models import (
    Checkpoint,
    DeploymentState,
    DeploymentVersion,
    JobState,
    Sweep,
    TrialMetric,
    TrialState,
    UsageInterval,
)
from orchestrator.states.core import Change
from orchestrator_contract.jobs import ScalingSpec
from orchestrator_contract.sweeps import SweepSpec, trial_spec

S = JobState
_RUN_HELD = frozenset({S.RUNNING, S.CANCELLING})
_RUN_NOT_WASTED = frozenset({S.SUCCEEDED, S.CANCELLED})
_DEPLOYMENT_HELD = frozenset(
    {DeploymentState.DEPLOYING, DeploymentState.HEALTHY, DeploymentState.UPDATING, DeploymentState.UNHEALTHY}
)
_DEPLOYMENT_MAY_HOLD = _DEPLOYMENT_HELD | {DeploymentState.QUEUED}  # QUEUED: while an older version serves
_ROLLING = frozenset({DeploymentState.DEPLOYING, DeploymentState.UPDATING})


def _open_interval(session: Session, subject_id: str) -> UsageInterval | None:
    return session.scalars(
        select(UsageInterval)
        .where(UsageInterval.subject_id == subject_id, UsageInterval.ended_at.is_(None))
        .order_by(UsageInterval.id.desc())
        .limit(1)
    ).one_or_none()


def _close(interval: UsageInterval, change: Change, wasted_from: datetime | None = None) -> None:
    interval.ended_at = change.at
    interval.end_state = str(getattr(change.to_state, "value", change.to_state))[:16]
    interval.end_reason = (change.reason or "")[:64]
    if wasted_from is not None:
        interval.wasted_from = min(max(wasted_from, interval.started_at), change.at)


def scaling_of(spec: dict[str, Any]) -> ScalingSpec:
    """A stored spec's scaling, its defaults (GPUs, memory) filled in."""
    return ScalingSpec.model_validate(spec.get("scaling") or {})


def _held(scaling: ScalingSpec) -> dict[str, Any]:
    return {
        "workers": scaling.num_workers,
        "cpus": scaling.cpus_per_worker,
        "gpus": scaling.gpus_per_worker or 0.0,
        "memory_gb": scaling.memory_per_worker_gb or 0.0,
    }


# --- jobs -------------------------------------------------------------------------------------------------


def job_usage(session: Session, change: Change) -> None:
    """The job lifecycle's hook: open a stretch on entering RUNNING, close it on leaving RUNNING/CANCELLING."""
    job = change.row
    if change.to_state == S.RUNNING and change.from_state != S.RUNNING:
        if _open_interval(session, job.id) is None:
            session.add(
                UsageInterval(
                    project_id=job.project_id,
                    kind="job",
                    subject_id=job.id,
                    attempt=job.attempt,
                    started_at=change.at,
                    **_held(scaling_of(job.spec)),
                )
            )
    elif change.from_state in _RUN_HELD and change.to_state not in _RUN_HELD:  # only then can one be open
        interval = _open_interval(session, job.id)
        if interval is None:
            return
        wasted_from = None
        if change.to_state not in _RUN_NOT_WASTED:
            last = session.scalar(
                select(func.max(Checkpoint.created_at)).where(
                    Checkpoint.job_id == job.id, Checkpoint.created_at >= interval.started_at
                )
            )
            wasted_from = last or interval.started_at
        _close(interval, change, wasted_from)


# --- trials -----------------------------------------------------------------------------------------------


def trial_usage(session: Session, change: Change) -> None:
    trial = change.row
    if change.to_state == TrialState.RUNNING and change.from_state != TrialState.RUNNING:
        if _open_interval(session, trial.id) is not None:
            return
        sweep = session.get(Sweep, trial.sweep_id)  # locked by the caller: already in the session
        if sweep is None:
            return
        scaling = trial_spec(SweepSpec.model_validate(sweep.spec).base, trial.config or {}).scaling
        session.add(
            UsageInterval(
                project_id=sweep.project_id,
                kind="trial",
                subject_id=trial.id,
                sweep_id=sweep.id,
                attempt=sweep.attempt,
                started_at=change.at,
                **_held(scaling),
            )
        )
    elif change.from_state == TrialState.RUNNING:
        interval = _open_interval(session, trial.id)
        if interval is None:
            return
        wasted_from = None
        if change.to_state == TrialState.FAILED:
            last = session.scalar(
                select(func.max(TrialMetric.created_at)).where(
                    TrialMetric.trial_id == trial.id,
                    TrialMetric.created_at >= interval.started_at,
                    TrialMetric.checkpoint_path.is_not(None),
                )
            )
            wasted_from = last or interval.started_at
        _close(interval, change, wasted_from)


# --- deployments ------------------------------------------------------------------------------------------


def replicas_of(settings: dict[str, Any]) -> int:
    """A version's replicas: the fixed count, or an autoscaled version's ``min``."""
    replicas = settings.get("replicas", 1)
    if isinstance(replicas, dict):
        return int(replicas.get("min", 1) or 0)
    return int(replicas)


def deployment_usage(session: Session, change: Change) -> None:
    """Every transition (and the creation) closes the open stretch and, while the deployment serves, opens
    the next with the replicas and resources of the version it serves now."""
    deployment = change.row
    interval = _open_interval(session, deployment.id) if change.from_state in _DEPLOYMENT_MAY_HOLD else None
    if interval is not None:
        _close(interval, change)
    serving_while_queued = change.to_state == DeploymentState.QUEUED and deployment.live_version is not None
    if change.to_state not in _DEPLOYMENT_HELD and not serving_while_queued:
        return
    number = deployment.version if change.to_state in _ROLLING else (deployment.live_version or deployment.version)
    version = session.scalars(
        select(DeploymentVersion).where(
            DeploymentVersion.deployment_id == deployment.id, DeploymentVersion.version == number
        )
    ).one_or_none()
    settings = version.settings if version is not None else {}
    resources = settings.get("resources") or {}
    session.add(
        UsageInterval(
            project_id=deployment.project_id,
            kind="deployment",
            subject_id=deployment.id,
            attempt=number or 0,
            started_at=change.at,
            workers=replicas_of(settings) if settings else 0,
            cpus=float(resources.get("cpus") or 0.0),
            gpus=float(resources.get("gpus") or 0.0),
            memory_gb=0.0,
        )
    )
