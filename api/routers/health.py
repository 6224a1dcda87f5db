from __future__ import annotations

import logging

from fastapi import APIRouter, Response, status
from sqlalchemy import text

from api.deps import ControlPlaneDep
from orchestrator.backend import BackendUnavailable

log = logging.getLogger(__name__)
router = APIRouter(tags=["health"])
# What /readyz says of a check that failed. It needs no key, so the error's own text (hosts, users,
# tokens in URLs) goes to the log only.
UNAVAILABLE = "error: unavailable"


@router.get("/healthz", summary="Liveness")
def healthz() -> dict[str, str]:
    """The process is up."""
    return {"status": "ok"}


@router.get("/readyz", summary="Readiness")
def readyz(service: ControlPlaneDep, response: Response) -> dict[str, str | bool]:
    """This replica can serve the API: 200 while the database answers, 503 when it does not. ``database`` and
    ``ray`` say what each answered (``ok...`` or ``error: unavailable``): Ray being down does not take the API
    out of service (history, logs from storage and submissions, which queue, keep working), so a caller that
    needs Ray waits for ``ray`` to start with ``ok``. ``leader``: whether this replica runs the background loops
    (the scheduler and the reconcilers; one replica at a time on PostgreSQL, always the one process on SQLite)."""
    checks: dict[str, str | bool] = {}
    try:
        with service.sessions() as session:
            session.execute(text("SELECT 1"))
        checks["database"] = "ok"
    except Exception as exc:
        log.warning("readyz: the database does not answer: %s", exc)
        checks["database"] = UNAVAILABLE
    try:
        capacity = service.backend.capacity()
        checks["ray"] = f"ok ({capacity.total.get('CPU', 0):g} CPU, {capacity.total.get('GPU', 0):g} GPU)"
    except BackendUnavailable as exc:
        log.warning("readyz: the Ray cluster does not answer: %s", exc)
        checks["ray"] = UNAVAILABLE
    checks["leader"] = service.is_leader
    if checks["database"] != "ok":
        response.status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    return checks
