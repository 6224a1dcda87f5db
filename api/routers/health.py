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
def readyz(service: ControlPlaneDep, response: Response) -> dict[str, str]:
    """The database and the Ray cluster both answer (200); else 503, saying which does not."""
    checks = {}
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
    if any(value.startswith("error") for value in checks.values()):
        response.status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    return checks
