from __future__ import annotations

from fastapi import APIRouter

from api.deps import CurrentKey
from orchestrator.planner import plan
from orchestrator_contract.rest import PlanRequest, PlanResponse

router = APIRouter(prefix="/v1/plan", tags=["planner"])


@router.post("", summary="Plan a model's training")
def make_plan(request: PlanRequest, _: CurrentKey) -> PlanResponse:
    """How a model fits and scales: memory per GPU for ddp, zero1, zero2 and fsdp, the recommended
    strategy, the global batch and scaled learning rate, and the gradient all-reduce time."""
    return plan(request)
