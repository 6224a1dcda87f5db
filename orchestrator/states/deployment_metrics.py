"""The state engine's metric hook for deployments: a rollout (DEPLOYING, UPDATING) that ends counts as
``promoted`` (HEALTHY) or ``failed`` (FAILED, UNHEALTHY) in ``orchestrator_deployment_rollouts``, when the
caller's transaction commits (as ``orchestrator/states/job_metrics.py`` does for jobs). A rollout that a
newer version replaces mid-way (DEPLOYING -> DEPLOYING, UPDATING -> UPDATING) or a delete counts nothing.
Deployments by state is a gauge read from the database at scrape time (``orchestrator.metrics``).
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from orchestrator.db.models import DeploymentState
from orchestrator.metrics import after_commit, metrics_of
from orchestrator.states.core import Change

D = DeploymentState
_ROLLING = (D.DEPLOYING, D.UPDATING)


def count_change(session: Session, change: Change) -> None:
    metrics = metrics_of(session)
    if metrics is None or change.from_state not in _ROLLING:
        return
    if change.to_state == D.HEALTHY:
        after_commit(session, metrics.deployment_rollouts.labels("promoted").inc)
    elif change.to_state in (D.FAILED, D.UNHEALTHY):
        after_commit(session, metrics.deployment_rollouts.labels("failed").inc)
