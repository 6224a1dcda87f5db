from __future__ import annotations

from fastapi import APIRouter, Response, status
from sqlalchemy import text

from api.deps import ServiceDep
from orchestrator.backend import BackendUnavailable

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz() -> dict[str, str]:
    """The process is up."""
    return {"status": "ok"}


@router.get("/readyz")
def readyz(service: ServiceDep, response: Response) -> dict[str, str]:
    """The database and the Ray cluster both answer."""
    checks = {}
    try:
        with service.sessions() as session:
            session.execute(text("SELECT 1"))
        checks["database"] = "ok"
    except Exception as exc:
        checks["database"] = f"error: {exc}"
    try:
        capacity = service.backend.capacity()
        checks["ray"] = f"ok ({capacity.total.get('CPU', 0):g} CPU, {capacity.total.get('GPU', 0):g} GPU)"
    except BackendUnavailable as exc:
        checks["ray"] = f"error: {exc}"
    if any(value.startswith("error") for value in checks.values()):
        response.status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    return checks
