"""``POST /internal/v1/{jobs|sweeps}/{id}/claim``: a driver exchanges its attempt's one-use claim code (its
``Authorization: Bearer``) for the run's token, which no listing of Ray's ever holds (docs/security.md, finding 1;
the driver's side: ``workers.runtime.claim``, the control plane's: ``orchestrator.services.run_claims``)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from orchestrator_contract.base import Strict

NONCE_PATTERN = r"^[A-Za-z0-9_-]+$"  # secrets.token_urlsafe's alphabet


class DriverClaim(Strict):
    attempt: int = Field(ge=1, description="The attempt the driver was started for (its --attempt).")
    nonce: str = Field(
        min_length=16,
        max_length=128,
        pattern=NONCE_PATTERN,
        description="Random, made by the driver's process and kept there: a retry with the same nonce (the answer "
        "was lost) gets a new token; a second exchange with another nonce is refused.",
    )


class ClaimedToken(BaseModel):
    token: str = Field(description="The run's token, for its /internal routes while this attempt is current.")
