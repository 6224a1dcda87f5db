"""``GET /metrics``: the control plane's Prometheus metrics (``orchestrator.metrics``) in the text format.

Who may scrape is ORCHESTRATOR_METRICS: ``admin`` (the default) needs a cluster-wide admin key, ``open``
none; ``off`` leaves the route out (404; api/app.py).
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Response

from api.deps import BearerDep, ControlPlaneDep, cluster_admin, current_principal
from orchestrator.metrics import CONTENT_TYPE


async def scrape_allowed(credentials: BearerDep, service: ControlPlaneDep) -> None:
    if service.settings.metrics != "open":
        await cluster_admin(await current_principal(credentials, service))


router = APIRouter(tags=["health"])


@router.get(
    "/metrics",
    summary="Prometheus metrics",
    dependencies=[Depends(scrape_allowed)],
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE: {}}, "description": "The metrics in Prometheus' text format"}},
)
def metrics(service: ControlPlaneDep) -> Response:
    """Jobs submitted, finished and by state, queue waits and run durations, restarts by reason, Ray calls by
    outcome, each background loop's last good tick, and HTTP requests by route template (every metric and its
    labels: docs/deploy.md, "Metrics and logs for operators"). Needs a cluster-wide admin key unless
    ORCHESTRATOR_METRICS=open; absent (404) when ORCHESTRATOR_METRICS=off."""
    return Response(service.metrics.exposition(), media_type=CONTENT_TYPE)
