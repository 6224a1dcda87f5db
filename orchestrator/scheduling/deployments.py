"""Deployments in the scheduler's queue (docs/scheduling.md).

A deployment's new version whose replicas ask more CPUs or GPUs than the deployment holds now waits QUEUED
(``orchestrator.services.deployments``); the scheduler's tick (``orchestrator.loops.scheduler``) hands it to
the same policy as the queued jobs and sweeps (``orchestrator.scheduling.policy``: its project's quota and
borrowing, fair share, the starvation guard, room on the cluster), so the quota arithmetic exists once. Here:
what the tick reads of the QUEUED deployments, and what it writes back: the rollout of those admitted, the
reason of those that still wait.

Within its project a deployment waits in the one queue as a run of priority 0 (a job's default) would: a job
of higher priority goes first, one of the same priority by age. Its age is its newest version's: asking for
another version while it waits starts the wait again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.orm import Session, sessionmaker

from orchestrator.admission import Demand, replicas_beyond
from orchestrator.db.models import Deployment, DeploymentState
from orchestrator.repositories import deployments as deployments_repo
from orchestrator.scheduling.policy import TickPlan, Waiting
from orchestrator.services.deployments import start_rollout
from orchestrator.states.deployments import applied_version, lock_deployment, note_deployment_waiting

log = logging.getLogger(__name__)

DEPLOYMENT_PRIORITY = 0  # a job's default priority (orchestrator_contract.jobs.JobSpec.priority)


@dataclass(frozen=True)
class QueuedDeployment:
    id: str
    name: str
    project_id: str
    version: int  # the newest version, the one waiting
    live_version: int | None  # the one that keeps serving meanwhile, if any
    asked_at: datetime  # when the newest version was asked for
    demand: Demand  # its replicas, beyond what the serving version holds
    noted: tuple[str, str]  # (reason, message) as last written: only a change is written
    cluster: str | None = None  # where it serves (placed at creation); None: the default cluster

    @property
    def key(self) -> str:
        return f"deployment:{self.id}"

    def waiting(self) -> Waiting:
        needs = "this deployment needs {}"
        if self.live_version is not None:
            needs = f"its version {self.version} needs {{}} more than version {self.live_version} holds"
        return Waiting(
            self.key,
            self.project_id,
            DEPLOYMENT_PRIORITY,
            self.asked_at,
            self.demand,
            is_run=False,
            needs=needs,
        )

    def explain(self, message: str) -> str:
        return f"{message}; version {self.live_version} keeps serving" if self.live_version is not None else message


def queued_deployments(session: Session) -> list[QueuedDeployment]:
    """Every QUEUED deployment, with what its newest version asks beyond the version serving now."""
    queued = []
    for deployment in deployments_repo.queued_deployments(session):
        newest = deployment.get_version(deployment.version)
        serving = applied_version(deployment)  # QUEUED: the last promoted version, if any
        queued.append(
            QueuedDeployment(
                deployment.id,
                deployment.name,
                deployment.project_id,
                deployment.version,
                deployment.live_version,
                newest.created_at,
                replicas_beyond(newest.settings, serving.settings if serving is not None else None),
                (deployment.reason, deployment.message),
                deployment.cluster,
            )
        )
    return queued


def carry_out(sessions: sessionmaker[Session], plan: TickPlan, queued: list[QueuedDeployment]) -> None:
    """The plan's part for deployments: roll out those admitted, say why the others wait."""
    admitted = dict(plan.admit)
    for deployment in queued:
        if deployment.key in admitted:
            _admit(sessions, deployment)
    note_waits(sessions, queued, {d.key: plan.waits[d.key] for d in queued if d.key in plan.waits})


def _admit(sessions: sessionmaker[Session], queued: QueuedDeployment) -> None:
    """Roll out the version that waited (never admitted by borrowing: ``policy.DEPLOYMENTS_DO_NOT_BORROW``)."""
    with sessions.begin() as session:
        deployment = _still_waiting(session, queued)
        if deployment is None:
            return  # deleted, or another version asked for, since the tick looked: the next tick decides
        start_rollout(session, deployment, "admitted", f"version {queued.version}")
    log.info("deployment %s: version %s admitted", queued.name, queued.version)


def note_waits(
    sessions: sessionmaker[Session], queued: list[QueuedDeployment], waits: dict[str, tuple[str, str]]
) -> None:
    """Write why each still waits, only where that changed, in one transaction."""
    changed = [
        (d, (reason, d.explain(message)))
        for d in queued
        if d.key in waits
        for reason, message in [waits[d.key]]
        if (reason, d.explain(message)) != d.noted
    ]
    if not changed:
        return
    with sessions.begin() as session:
        for queued_deployment, (reason, message) in changed:
            deployment = _still_waiting(session, queued_deployment)
            if deployment is not None:
                note_deployment_waiting(deployment, reason, message)


def _still_waiting(session: Session, queued: QueuedDeployment) -> Deployment | None:
    deployment = lock_deployment(session, queued.id)
    if deployment is None or deployment.state != DeploymentState.QUEUED or deployment.version != queued.version:
        return None
    return deployment
