"""One attempt of a training job, once its driver holds the run's token and its assignment (``workers.train.driver``):
runs it as a Ray Train ``TorchTrainer`` and reports how it ended. Imported by the driver after its claim: Ray and
PyTorch take seconds to import, and the claim code is listed in Ray's job table until it is exchanged."""

from __future__ import annotations

import logging
import traceback

from orchestrator_contract.jobs import DriverAssignment, DriverExit, StartupEvent, StateEvent
from workers.runtime.claim import RunToken
from workers.runtime.reporter import EventReporter
from workers.runtime.train_loop import PREEMPTED_KEY
from workers.train.callbacks import checkpoint_event
from workers.train.failures import APP_ERROR, CODE_ERROR, OOM, WORKER_DIED, FailureCause, classify_training_error
from workers.train.trainer import build_trainer

log = logging.getLogger("workers.train.driver")

# Long enough to ride out a short control plane restart: after this the outcome only exists in Ray.
FINAL_FLUSH_TIMEOUT_S = 60.0
MAX_MESSAGE_CHARS = 15_000


def run_attempt(assignment: DriverAssignment, control_plane_url: str | None, token: RunToken | str) -> int:
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
            avoid_nodes=assignment.avoid_nodes,
        )
        reporter.emit(StartupEvent(stage="trainer_started"))  # its start-up timeline: Ray Train starts now
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


def finish_reporting(reporter: EventReporter) -> None:
    """Deliver what is left (the outcome above all) before the driver exits, then stop the reporter."""
    if not reporter.flush(FINAL_FLUSH_TIMEOUT_S):
        log.error("the control plane did not take the final events within %.0fs", FINAL_FLUSH_TIMEOUT_S)
    reporter.close()
