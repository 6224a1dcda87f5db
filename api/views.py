"""Responses that need more than one row's attributes: built here, in the API layer, from database rows.
Everything else is ``Model.model_validate(row)`` (the contract's models read rows by attribute name)."""

from __future__ import annotations

from collections.abc import Mapping

from orchestrator.db.models import Deployment, DeploymentState, Sweep, Trial
from orchestrator_contract.deployments import auth_of, max_body_mb_of
from orchestrator_contract.rest import BestTrialOut, DeploymentOut, DeploymentVersionOut, ReplicaOut, RunOut, SweepOut
from orchestrator_contract.sweeps import SweepSpec


def sweep_out(sweep: Sweep, counts: dict[str, int], best: Trial | None) -> SweepOut:
    spec = sweep.spec
    best_out = None
    if best is not None and best.best_metric is not None:
        best_out = BestTrialOut(
            id=best.id,
            config=best.config,
            metric=best.best_metric,
            epoch=best.best_epoch,
            checkpoint_path=best.checkpoint_path,
        )
    return SweepOut(
        # A field a sweep has no column for keeps its default.
        **{name: getattr(sweep, name) for name in RunOut.model_fields if hasattr(sweep, name)},
        metric=spec["metric"],
        mode=spec["mode"],
        total_trials=SweepSpec.model_validate(spec).total_trials,
        trials=counts,
        best_trial=best_out,
    )


def deployment_out(deployment: Deployment, serve_urls: Mapping[str | None, str]) -> DeploymentOut:
    """``serve_urls``: each cluster's Serve base URL (``clusters_repo.serve_urls``): its URL names its cluster."""
    serve_url = serve_urls.get(deployment.cluster, serve_urls[None])
    versions = [DeploymentVersionOut.model_validate(v) for v in deployment.versions]
    by_number = {v.version: v for v in versions}
    observed = deployment.observed or {}
    serving = deployment.live_version if deployment.state != DeploymentState.DELETED else None
    enforced = by_number.get(serving) if serving is not None else None
    enforced = enforced or by_number[deployment.version]
    return DeploymentOut(
        id=deployment.id,
        project_id=deployment.project_id,
        name=deployment.name,
        workload=deployment.workload,
        state=deployment.state,
        reason=deployment.reason,
        message=deployment.message,
        url=f"{serve_url}{deployment.route_prefix}",
        cluster=deployment.cluster,
        route_prefix=deployment.route_prefix,
        version=deployment.version,
        serving_version=serving,
        current=by_number.get(serving) if serving is not None else None,
        target=by_number[deployment.version],
        auth=auth_of(enforced.settings),
        max_body_mb=max_body_mb_of(enforced.settings),
        serve_status=observed.get("status"),
        replicas=[ReplicaOut(**r) for r in observed.get("replicas", [])],
        observed_at=observed.get("observed_at"),
        versions=versions,
        created_at=deployment.created_at,
        updated_at=deployment.updated_at,
        deleted_at=deployment.deleted_at,
    )
