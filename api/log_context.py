"""Names the entity a request is about in its log records: the route's path parameters (``job_id``,
``sweep_id``, ``trial_id``, a deployment's ``name``) into ``orchestrator.request_context``.

An app-wide dependency, async so that it runs in the request's own task: the ids it sets are seen by the
route (a sync route runs in a thread with a copy of that context) and by the access log, and the request-id
middleware resets them when the request ends.
"""

from __future__ import annotations

from fastapi import Request

from orchestrator.request_context import bind

DEPLOYMENTS = "/v1/deployments/"


async def bind_log_context(request: Request) -> None:
    params = request.path_params
    if not params:
        return
    route = getattr(request.scope.get("route"), "path", "")
    bind(
        job_id=params.get("job_id"),
        sweep_id=params.get("sweep_id"),
        trial_id=params.get("trial_id"),
        deployment=params.get("name") if route.startswith(DEPLOYMENTS) else None,
    )
