"""Ray Job entrypoint for one attempt of a training job.

    python -m workers.train.driver --job-id ID --attempt N

Reads ``ORCHESTRATOR_URL`` and ``ORCHESTRATOR_JOB_TOKEN`` from the environment, fetches the attempt's
assignment from the control plane, runs it as a Ray Train ``TorchTrainer`` and reports how it ended.
Exit status (``DriverExit``): 0 succeeded, 3 training failed for good (reported with its cause), 2 misconfigured
environment; 1, an uncaught error (the assignment could not be fetched), lets the control plane try again.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback

import httpx
import ray

from workers.contract.jobs import DriverAssignment, DriverExit, StateEvent
from workers.runtime.reporter import EventReporter
from workers.runtime.retry import RetryableStatus, RetryPolicy, raise_if_retryable
from workers.runtime.train_loop import PREEMPTED_KEY
from workers.train.callbacks import checkpoint_event
from workers.train.failures import APP_ERROR, CODE_ERROR, OOM, WORKER_DIED, FailureCause, classify_training_error
from workers.train.trainer import build_trainer

log = logging.getLogger("workers.train.driver")

# The assignment fetch: at most 5 tries, waits of about 1, 2, 4, 8 s (jittered, each at most 10 s; about 15 s in
# all, at most 20.5), each request at most FETCH_TIMEOUT_S; then the attempt fails and the control plane decides.
FETCH_RETRY = RetryPolicy(first_delay_s=1.0, cap_s=10.0, max_tries=5)
FETCH_TIMEOUT_S = 10.0
# Long enough to ride out a short control plane restart: after this the outcome only exists in Ray.
FINAL_FLUSH_TIMEOUT_S = 60.0
MAX_MESSAGE_CHARS = 15_000


def fetch_assignment(
    url: str, job_id: str, attempt: int, token: str, collection: str = "jobs", model: type = DriverAssignment
):
    """``GET /internal/v1/jobs/{job_id}/assignment?attempt=N`` (a sweep's: ``collection="sweeps"``, ``model``
    ``SweepAssignment``), retried while the control plane is away (``FETCH_RETRY``: a transport error, a 5xx,
    408 or 429, see ``workers.runtime.retry``). Any other 4xx (a refused token, an unknown job) will not pass by waiting: ``HTTPStatusError``
    at once. ``RuntimeError`` when the tries run out."""
    endpoint = f"{url.rstrip('/')}/internal/v1/{collection}/{job_id}/assignment"
    headers = {"Authorization": f"Bearer {token}"}

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


def run_attempt(assignment: DriverAssignment, control_plane_url: str | None, token: str) -> int:
    """Train on the Ray cluster this process is connected to; report the outcome; return the exit code."""
    job_id, attempt, spec = assignment.job_id, assignment.attempt, assignment.spec
    plan = assignment.plan
    log.info(
        "job %s attempt %d: workload %s, %d worker(s), %s%s, storage %s/%s",
        job_id,
        attempt,
        spec.runs,
        spec.scaling.num_workers,
        plan.strategy,
        f" ({plan.reason})" if plan.reason else "",
        assignment.storage_path.rstrip("/"),
        job_id,
    )
    reporter = EventReporter(control_plane_url, job_id, attempt, token)
    try:
        trainer = build_trainer(
            job_id=job_id,
            attempt=attempt,
            spec=spec,
            plan=plan,
            storage_path=assignment.storage_path,
            control_plane_url=control_plane_url,
            token=token,
        )
        result = trainer.fit()
    except Exception as exc:
        cause = classify_training_error(exc)
        if not cause.conclusive:
            log.error(
                "job %s attempt %d: the Ray cluster failed under the driver; the control plane decides "
                "what comes next:\n%s",
                job_id,
                attempt,
                traceback.format_exc(),
            )
            reporter.close()
            return DriverExit.CLUSTER_FAILED
        message = f"{failure_summary(cause, spec)}\n{cause.detail[-MAX_MESSAGE_CHARS:]}"
        log.error(
            "job %s attempt %d failed (%s):\n%s\n%s", job_id, attempt, cause.reason, message, traceback.format_exc()
        )
        reporter.emit(StateEvent(state="failed", reason=cause.reason, message=message))
        exit_code = DriverExit.TRAINING_FAILED
    else:
        returned = getattr(result, "return_value", None)
        if isinstance(returned, dict) and PREEMPTED_KEY in returned:
            return preempted(reporter, result, assignment, returned[PREEMPTED_KEY])
        # The controller's callback reports checkpoints live, but dies right after the run: repeat the
        # final one here (events are idempotent) so it cannot be lost, if it is complete. Only that one:
        # Ray Train keeps every checkpoint in its books (retention is the control plane's), so
        # best_checkpoints may name ones already deleted, and those must never be recorded again.
        checkpoint = result.checkpoint
        final = checkpoint_event(checkpoint, result.metrics or {}, assignment.storage_path) if checkpoint else None
        if final is not None:
            reporter.emit(final)
            # Delivered (and retention applied to it) before the job is reported finished.
            reporter.flush(FINAL_FLUSH_TIMEOUT_S)
        # A training function's result is the last metrics it reported (its return value), which a checkpoint
        # need not carry; the loop's last report always does.
        metrics = returned if isinstance(returned, dict) else result.metrics
        outcome = {"metrics": metrics, "checkpoint_path": final.path if final else None}
        reporter.emit(StateEvent(state="succeeded", result=outcome))
        log.info("job %s attempt %d succeeded: %s", job_id, attempt, outcome)
        exit_code = DriverExit.SUCCEEDED
    finish_reporting(reporter)
    return exit_code


def preempted(reporter: EventReporter, result, assignment: DriverAssignment, step: int) -> int:
    """The control plane preempted the job and the loop stopped after a committed checkpoint of ``step``:
    record that checkpoint (it resumes from it), report no outcome (the control plane requeues the job)."""
    checkpoint = result.checkpoint
    final = checkpoint_event(checkpoint, result.metrics or {}, assignment.storage_path) if checkpoint else None
    if final is not None:
        reporter.emit(final)
    log.info(
        "job %s attempt %d preempted: checkpointed at step %d and stopped; the control plane requeues it",
        assignment.job_id,
        assignment.attempt,
        step,
    )
    finish_reporting(reporter)
    return DriverExit.PREEMPTED


def failure_summary(cause: FailureCause, spec) -> str:
    """The first line of a FAILED job's message: what failed, and why it was not retried."""
    retries_off = "" if spec.retries.retry_app_errors else " (retries.retry_app_errors is off)"
    if cause.reason == CODE_ERROR:
        where = f" at {cause.where}" if cause.where else ""
        if cause.permanent:
            what = f"the workload {spec.workload!r}" if spec.workload else f"the entrypoint {spec.entrypoint!r}"
            return f"{what} could not be loaded from your code{where} (never retried)"
        return f"your code raised an exception{where}{retries_off}"
    return {
        WORKER_DIED: f"the worker group failed after {spec.retries.max_worker_restarts} restart(s), its budget",
        OOM: "out of memory (never retried: the same step would run out again)",
        APP_ERROR: f"the training code raised an exception{retries_off}",
    }[cause.reason]


def start_driver(
    argv: list[str] | None, prog: str, description: str, run_flag: str
) -> tuple[str, int, str, str] | None:
    """The command line and environment every driver (a job's, a sweep's) starts from: logging to stdout,
    ``--<run_flag> ID --attempt N``, ``ORCHESTRATOR_URL`` and ``ORCHESTRATOR_JOB_TOKEN``. Returns (run id,
    attempt, url, token), or None (logged) when the environment lacks one of them."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument(f"--{run_flag}", required=True, dest="run_id", metavar="ID")
    parser.add_argument("--attempt", required=True, type=int)
    args = parser.parse_args(argv)
    logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    url = os.environ.get("ORCHESTRATOR_URL")
    token = os.environ.get("ORCHESTRATOR_JOB_TOKEN")
    if not url or not token:
        log.error("ORCHESTRATOR_URL and ORCHESTRATOR_JOB_TOKEN must both be set")
        return None
    return args.run_id, args.attempt, url, token


def finish_reporting(reporter: EventReporter) -> None:
    """Deliver what is left (the outcome above all) before the driver exits, then stop the reporter."""
    if not reporter.flush(FINAL_FLUSH_TIMEOUT_S):
        log.error("the control plane did not take the final events within %.0fs", FINAL_FLUSH_TIMEOUT_S)
    reporter.close()


def main(argv: list[str] | None = None) -> int:
    started = start_driver(argv, "python -m workers.train.driver", __doc__.splitlines()[0], "job-id")
    if started is None:
        return DriverExit.MISCONFIGURED
    job_id, attempt, url, token = started
    log.info("job %s attempt %d: fetching the assignment from %s", job_id, attempt, url)
    assignment = fetch_assignment(url, job_id, attempt, token)
    ray.init()  # inside a Ray Job this joins the job's cluster
    return run_attempt(assignment, url, token)


if __name__ == "__main__":
    sys.exit(main())
