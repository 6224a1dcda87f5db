"""Deployment rules and the companion fields of a deployment's state.

    QUEUED    -> DEPLOYING | UPDATING      admitted by the scheduler (its project's quota and the cluster have
                                           room for its replicas): rolled out, with nothing or an old version serving
    DEPLOYING -> HEALTHY | FAILED          the first version comes up, or never does
    HEALTHY   -> UPDATING | UNHEALTHY      a new version is rolled out; Serve reports trouble
    UPDATING  -> HEALTHY | UNHEALTHY       promoted; or failed, and the old version keeps serving
    UNHEALTHY -> HEALTHY | UPDATING        recovered; or a new version (e.g. a rollback)
    FAILED    -> DEPLOYING                 a new version of a deployment that never served
    any live  -> QUEUED                    a new version whose replicas ask more than the deployment holds now
    any live  -> DELETED                   final

A new deployment starts DEPLOYING, or QUEUED when its replicas hold CPUs or GPUs (the scheduler admits it,
``orchestrator.scheduling.deployments``). While QUEUED nothing of the newest version runs; the last
promoted version, if any, keeps serving (``applied_version``). DEPLOYING -> DEPLOYING, UPDATING -> UPDATING
and QUEUED -> QUEUED record a newer version requested meanwhile. The API (create, update, rollback,
delete), the scheduler (admission) and the serving reconciler (what Serve reports) all go through
``set_deployment_state`` on a row loaded with ``lock_deployment``.

The version pointers follow the state (``_version_pointers``): a rollout (DEPLOYING, UPDATING) that ends
HEALTHY promotes the newest version (``live_version``) and forgets a failed one; one that ends FAILED or
UNHEALTHY marks the newest version failed (``failed_version``: not applied again); entering a rollout (a
new version is the target) forgets the failed one.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from orchestrator.db.models import Deployment, DeploymentEvent, DeploymentState, DeploymentVersion
from orchestrator.states.core import Change, Lifecycle, Rule, allowed, lock_row, record_creation, transition
from orchestrator.states.deployment_metrics import count_change
from orchestrator.states.usage_ledger import deployment_usage

D = DeploymentState
TERMINAL: frozenset[DeploymentState] = frozenset({D.DELETED})
LIVE: frozenset[DeploymentState] = frozenset(set(D) - {D.DELETED})
ROLLING: frozenset[DeploymentState] = frozenset({D.DEPLOYING, D.UPDATING})


RULES: tuple[Rule, ...] = (
    Rule(frozenset({D.QUEUED}), frozenset({D.QUEUED, D.DEPLOYING, D.UPDATING, D.DELETED})),
    Rule(frozenset({D.DEPLOYING}), frozenset({D.QUEUED, D.DEPLOYING, D.HEALTHY, D.FAILED, D.DELETED})),
    Rule(frozenset({D.HEALTHY}), frozenset({D.QUEUED, D.UPDATING, D.UNHEALTHY, D.DELETED})),
    Rule(frozenset({D.UPDATING}), frozenset({D.QUEUED, D.UPDATING, D.HEALTHY, D.UNHEALTHY, D.DELETED})),
    Rule(frozenset({D.UNHEALTHY}), frozenset({D.QUEUED, D.HEALTHY, D.UPDATING, D.DELETED})),
    Rule(frozenset({D.FAILED}), frozenset({D.QUEUED, D.DEPLOYING, D.DELETED})),
)


def applied_version(deployment: Deployment) -> DeploymentVersion | None:
    """The version Serve should run: the newest, unless its rollout failed (then the last healthy one) or it
    waits to be admitted (QUEUED: the last promoted one, if any, keeps serving); none for a deployment that
    never served and failed or waits, or was deleted."""
    if deployment.state in (D.DELETED, D.FAILED):
        return None
    if deployment.state == D.QUEUED or (
        deployment.failed_version is not None and deployment.failed_version == deployment.version
    ):
        return deployment.get_version(deployment.live_version)
    return deployment.get_version(deployment.version)


def is_allowed(from_state: DeploymentState, to_state: DeploymentState) -> bool:
    return allowed(RULES, from_state, to_state)


def _history(_session: Session, change: Change) -> DeploymentEvent:
    deployment = change.row
    return DeploymentEvent(
        deployment_id=deployment.id,
        from_state=change.from_state,
        to_state=change.to_state,
        reason=change.reason,
        message=change.message,
        version=deployment.version,
    )


def _version_pointers(_session: Session, change: Change) -> None:
    deployment = change.row
    if change.to_state in ROLLING or change.to_state == D.QUEUED:
        deployment.failed_version = None  # a new target: nothing of it has failed yet
    elif change.from_state in ROLLING and change.to_state == D.HEALTHY:
        deployment.live_version = deployment.version  # promoted
        deployment.failed_version = None
    elif change.from_state in ROLLING and change.to_state in (D.FAILED, D.UNHEALTHY):
        deployment.failed_version = deployment.version  # not applied again; a live version keeps serving


def _times(_session: Session, change: Change) -> None:
    deployment = change.row
    if change.to_state in ROLLING:
        deployment.rollout_started_at = change.at
    elif change.from_state in ROLLING:
        deployment.rollout_started_at = None
    if change.to_state == D.DELETED:
        deployment.deleted_at = change.at


def _created(_session: Session, change: Change) -> None:
    deployment = change.row
    if deployment.state == D.QUEUED:
        deployment.message = f"queued {change.message}: {QUEUED_MESSAGE}"
        return
    deployment.message = f"deploying {change.message}"
    deployment.rollout_started_at = deployment.created_at


# What a deployment says until the scheduler's first look says why it waits (or admits it).
QUEUED_MESSAGE = "waiting for the scheduler to admit its replicas (its project's quota, room on the cluster)"


DEPLOYMENT_LIFECYCLE = Lifecycle(
    kind="deployment",
    rules=RULES,
    initial=frozenset({D.DEPLOYING, D.QUEUED}),
    terminal=TERMINAL,
    history=_history,
    subject=lambda deployment: deployment.name,
    after=(_version_pointers, _times, count_change, deployment_usage),
    on_create=(_created, deployment_usage),
)


def lock_deployment(session: Session, deployment_id: str) -> Deployment | None:
    """Load a deployment with its row locked for the rest of the transaction (SQLite: BEGIN IMMEDIATE)."""
    return lock_row(session, Deployment, deployment_id)


def set_deployment_state(
    session: Session,
    deployment: Deployment,
    to_state: DeploymentState,
    reason: str,
    message: str = "",
    again: bool = False,
) -> bool:
    """Move a locked deployment to ``to_state`` and record why, with its version pointers and times.

    Returns False, changing nothing, when it is already there unless ``again`` says the repeat is news
    (a newer version requested mid-rollout). Raises IllegalTransition for a move the rules forbid.
    Never commits.
    """
    return transition(session, DEPLOYMENT_LIFECYCLE, deployment, to_state, reason, message, again=again)


def record_deployment_created(session: Session, deployment: Deployment, what: str) -> None:
    """The history row of a new deployment (DEPLOYING ``what``, e.g. "version 1 from job X", which starts
    rolling out its first version, or QUEUED until the scheduler admits it). The row must be flushed and hold
    that version. Never commits."""
    record_creation(session, DEPLOYMENT_LIFECYCLE, deployment, "created", what)


def note_deployment_waiting(deployment: Deployment, reason: str, message: str) -> None:
    """Say why a QUEUED deployment still waits (e.g. ``quota_exceeded``): no transition, no history row."""
    if (deployment.reason, deployment.message) != (reason, message):
        deployment.reason = reason
        deployment.message = message
