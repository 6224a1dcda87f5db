"""Deployment state rules and the ONE function that changes a deployment's state.

The same pattern as jobs (``orchestrator.states``): ``set_deployment_state`` locks nothing itself but
is only called on a row loaded with ``lock_deployment``; it checks the rule, appends a history row and
updates the deployment. The API (create, update, rollback, delete) and the serving reconciler (what
Serve reports) both go through it.

    DEPLOYING -> HEALTHY | FAILED          the first version comes up, or never does
    HEALTHY   -> UPDATING | UNHEALTHY      a new version is rolled out; Serve reports trouble
    UPDATING  -> HEALTHY | UNHEALTHY       promoted; or failed, and the old version keeps serving
    UNHEALTHY -> HEALTHY | UPDATING        recovered; or a new version (e.g. a rollback)
    FAILED    -> DEPLOYING                 a new version of a deployment that never served
    any live  -> DELETED                   final

DEPLOYING -> DEPLOYING and UPDATING -> UPDATING record a newer version requested mid-rollout.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestrator.db.models import Deployment, DeploymentEvent, DeploymentState, utcnow
from orchestrator.states import Rule, allowed

D = DeploymentState
TERMINAL: frozenset[DeploymentState] = frozenset({D.DELETED})
LIVE: frozenset[DeploymentState] = frozenset(set(D) - {D.DELETED})
ROLLING: frozenset[DeploymentState] = frozenset({D.DEPLOYING, D.UPDATING})


RULES: tuple[Rule, ...] = (
    Rule(frozenset({D.DEPLOYING}), frozenset({D.DEPLOYING, D.HEALTHY, D.FAILED, D.DELETED})),
    Rule(frozenset({D.HEALTHY}), frozenset({D.UPDATING, D.UNHEALTHY, D.DELETED})),
    Rule(frozenset({D.UPDATING}), frozenset({D.UPDATING, D.HEALTHY, D.UNHEALTHY, D.DELETED})),
    Rule(frozenset({D.UNHEALTHY}), frozenset({D.HEALTHY, D.UPDATING, D.DELETED})),
    Rule(frozenset({D.FAILED}), frozenset({D.DEPLOYING, D.DELETED})),
)


def is_allowed(from_state: DeploymentState, to_state: DeploymentState) -> bool:
    return allowed(RULES, from_state, to_state)


class IllegalTransition(Exception):
    def __init__(self, name: str, from_state: DeploymentState, to_state: DeploymentState):
        super().__init__(f"deployment {name} cannot go from {from_state} to {to_state}")
        self.from_state = from_state
        self.to_state = to_state


def lock_deployment(session: Session, deployment_id: str) -> Deployment | None:
    """Load a deployment with its row locked for the rest of the transaction (SQLite: BEGIN IMMEDIATE)."""
    return session.scalars(
        select(Deployment)
        .where(Deployment.id == deployment_id)
        .with_for_update()
        .execution_options(populate_existing=True)
    ).one_or_none()


def set_deployment_state(
    session: Session,
    deployment: Deployment,
    to_state: DeploymentState,
    reason: str,
    message: str = "",
    again: bool = False,
) -> bool:
    """Move a locked deployment to ``to_state`` and record why.

    Returns False, changing nothing, when it is already there unless ``again`` says the repeat is news
    (a newer version requested mid-rollout). Raises IllegalTransition for a move the rules forbid.
    Never commits.
    """
    if deployment.state == to_state and not again:
        return False
    if not is_allowed(deployment.state, to_state):
        raise IllegalTransition(deployment.name, deployment.state, to_state)
    session.add(
        DeploymentEvent(
            deployment_id=deployment.id,
            from_state=deployment.state,
            to_state=to_state,
            reason=reason,
            message=message,
            version=deployment.version,
        )
    )
    now = utcnow()
    if to_state in ROLLING:
        deployment.rollout_started_at = now
    elif deployment.state in ROLLING:
        deployment.rollout_started_at = None
    if to_state == D.DELETED:
        deployment.deleted_at = now
    deployment.state = to_state
    deployment.reason = reason
    deployment.message = message
    deployment.updated_at = now
    return True
