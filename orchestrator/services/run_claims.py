"""A driver claims its run's token with its attempt's one-use claim code (docs/security.md, finding 1).

Ray lists a job's ``runtime_env`` to every process on the cluster, so the token a driver reports with is never put
there: each submission carries a fresh claim code (``services.launch.new_driver_claim``; only its hash is kept,
``claim_hash``), and the driver exchanges it at its start (``workers.runtime.claim``) for a new token of the run
(``token_hash``). The exchange is bound to the driver that made it by a random nonce it sends (its hash is kept,
``claimed_by``):

- the first exchange of the current attempt's code, while the run is starting or running, returns a token;
- the same nonce again (the driver retrying after its answer was lost) returns a new token, and the one before
  stops working: nobody but that driver knows the nonce, and no retry can leave it without a token;
- anything else is a 401 with one message whatever the cause (no oracle), logged as a warning naming the run
  and attempt: a code that is not the current attempt's (an old attempt's, or made up), a second exchange with
  another nonce (somebody else read the code, from Ray's job table or the driver's environment), a run that is
  not starting or running (ended, requeued, being cancelled).

A copy of the code read from Ray is thus worth nothing once the driver claimed, and if it is used first, the
driver's own claim is refused (logged here): the driver exits without running and the run gets a new attempt
with a new code, while whatever the copy's holder reports is held until Ray confirms it
(``services.reported_ends``), so it cannot end the run.
"""

from __future__ import annotations

import logging

from orchestrator.auth import generate_secret, hash_secret, secrets_equal
from orchestrator.db.models import Job, JobState, Sweep
from orchestrator.errors import Unauthorized
from orchestrator.states.jobs import issue_driver_token

log = logging.getLogger(__name__)

Run = Job | Sweep
REFUSED = "not this attempt's claim code"
CLAIMABLE = frozenset({JobState.STARTING, JobState.RESTARTING, JobState.RUNNING})  # a driver may be starting


def check_code(kind: str, run: Run | None, code: str | None) -> Run:
    """The run whose current claim code ``code`` is; else Unauthorized (logged when the run exists: nobody
    honest holds a wrong code for it)."""
    if run is None or not code:
        raise Unauthorized(REFUSED)
    if not run.claim_hash or not secrets_equal(hash_secret(code), run.claim_hash):
        log.warning(
            "refused a claim for %s %s: not the claim code of its current attempt %d (an old attempt's, or made up)",
            kind,
            run.id,
            run.attempt,
        )
        raise Unauthorized(REFUSED)
    return run


def exchange(kind: str, run: Run, attempt: int, nonce: str) -> str:
    """The run's new token, for the driver of ``attempt`` that sent ``nonce`` (``run`` locked, its current code
    checked by ``check_code``); only its hash is kept. Unauthorized, logged, for any claim but the driver's own
    (see the module's docstring)."""
    subject = f"{kind} {run.id} attempt {attempt}"
    if attempt != run.attempt:
        _refuse(subject, f"the current attempt is {run.attempt}")
    if run.state not in CLAIMABLE:
        _refuse(subject, f"the {kind} is {run.state}, not starting or running")
    nonce_hash = hash_secret(nonce)
    if run.claimed_by and not secrets_equal(nonce_hash, run.claimed_by):
        _refuse(
            subject,
            "its claim code was exchanged already, by another process: somebody else holds a copy of it "
            "(Ray lists it to the whole cluster)",
        )
    if run.claimed_by:
        log.info("%s: its driver claimed again (its answer was lost?): a new token, the one before revoked", subject)
    token = generate_secret("jtk_")
    issue_driver_token(run, hash_secret(token), nonce_hash)
    return token


def _refuse(subject: str, why: str) -> None:
    log.warning("refused a claim for %s: %s", subject, why)
    raise Unauthorized(REFUSED)
