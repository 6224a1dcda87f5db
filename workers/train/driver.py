"""Ray Job entrypoint for one attempt of a training job.

    python -m workers.train.driver --job-id ID --attempt N

Reads ``ORCHESTRATOR_URL`` and the attempt's one-use ``ORCHESTRATOR_CLAIM_CODE`` from the environment and, first
thing, exchanges the code for the run's token (``workers.runtime.claim``: Ray lists a job's environment, so the
token is never put there); then fetches the attempt's assignment, runs it as a Ray Train ``TorchTrainer``
(``workers.train.attempt``, imported only now: Ray and PyTorch take seconds to import) and reports how it ended.
Exit status (``DriverExit``): 0 succeeded, 3 training failed for good (reported with its cause), 2 misconfigured
environment; 1, an uncaught error (the claim refused, the assignment could not be fetched), lets the control plane
try again.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

import httpx

from orchestrator_contract.jobs import DriverAssignment, DriverExit
from workers.runtime.claim import ClaimRefused, RunToken, bearer, claim_code_from_environment, claim_token
from workers.runtime.retry import RetryableStatus, RetryPolicy, raise_if_retryable

log = logging.getLogger("workers.train.driver")

# The assignment fetch: at most 5 tries, waits of about 1, 2, 4, 8 s (jittered, each at most 10 s; about 15 s in
# all, at most 20.5), each request at most FETCH_TIMEOUT_S; then the attempt fails and the control plane decides.
FETCH_RETRY = RetryPolicy(first_delay_s=1.0, cap_s=10.0, max_tries=5)
FETCH_TIMEOUT_S = 10.0
CLAIM_REFUSED_EXIT = 1  # not a DriverExit: for the reconciler a lost driver, worth a new attempt (a new code)


def fetch_assignment(
    url: str,
    job_id: str,
    attempt: int,
    token: RunToken | str,
    collection: str = "jobs",
    model: type = DriverAssignment,
):
    """``GET /internal/v1/jobs/{job_id}/assignment?attempt=N`` (a sweep's: ``collection="sweeps"``, ``model``
    ``SweepAssignment``), retried while the control plane is away (``FETCH_RETRY``: a transport error, a 5xx,
    408 or 429, see ``workers.runtime.retry``). Any other 4xx (a refused token, an unknown job) will not pass by waiting: ``HTTPStatusError``
    at once. ``RuntimeError`` when the tries run out."""
    endpoint = f"{url.rstrip('/')}/internal/v1/{collection}/{job_id}/assignment"
    headers = bearer(token)

    def get() -> httpx.Response:
        response = httpx.get(endpoint, params={"attempt": attempt}, headers=headers, timeout=FETCH_TIMEOUT_S)
        return raise_if_retryable(response).raise_for_status()

    try:
        response = FETCH_RETRY.call(
            get, retry_on=(httpx.TransportError, RetryableStatus), what="fetching the assignment", logger=log
        )
    except (httpx.TransportError, RetryableStatus) as exc:
        raise RuntimeError(f"no assignment from {endpoint} after {FETCH_RETRY.max_tries} tries: {exc}") from exc
    assignment = model.model_validate(response.json())
    got = (getattr(assignment, f"{collection[:-1]}_id"), assignment.attempt)
    if got != (job_id, attempt):
        raise RuntimeError(f"asked for {job_id} attempt {attempt}, got {got[0]} attempt {got[1]}")
    return assignment


def start_driver(
    argv: list[str] | None, prog: str, description: str, run_flag: str
) -> tuple[str, int, str, RunToken] | int:
    """How every driver (a job's, a sweep's) starts, before any heavy import: logging to stdout, ``--<run_flag> ID
    --attempt N``, ``ORCHESTRATOR_URL`` and ``ORCHESTRATOR_CLAIM_CODE``, and the claim exchanged for the run's
    token. Returns (run id, attempt, url, token), or the exit status (logged): ``DriverExit.MISCONFIGURED`` when
    the environment lacks the URL or the code, ``CLAIM_REFUSED_EXIT`` when the control plane refused the code."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument(f"--{run_flag}", required=True, dest="run_id", metavar="ID")
    parser.add_argument("--attempt", required=True, type=int)
    args = parser.parse_args(argv)
    logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    url = os.environ.get("ORCHESTRATOR_URL")
    code = claim_code_from_environment()
    if not url or not code:
        log.error("ORCHESTRATOR_URL and ORCHESTRATOR_CLAIM_CODE must both be set")
        return DriverExit.MISCONFIGURED
    collection = "sweeps" if run_flag == "sweep-id" else "jobs"
    try:
        token = claim_token(url, collection, args.run_id, args.attempt, code)
    except ClaimRefused as exc:
        log.error("%s; exiting without running: the control plane gives the run a new attempt", exc)
        return CLAIM_REFUSED_EXIT
    return args.run_id, args.attempt, url, token


def main(argv: list[str] | None = None) -> int:
    started = start_driver(argv, "python -m workers.train.driver", __doc__.splitlines()[0], "job-id")
    if isinstance(started, int):
        return started
    job_id, attempt, url, token = started
    log.info("job %s attempt %d: fetching the assignment from %s", job_id, attempt, url)
    assignment = fetch_assignment(url, job_id, attempt, token)
    # Here, after the claim, not at the top: see the module's docstring.
    import ray

    from workers.train.attempt import run_attempt

    ray.init()  # inside a Ray Job this joins the job's cluster
    return run_attempt(assignment, url, token)


if __name__ == "__main__":
    sys.exit(main())
