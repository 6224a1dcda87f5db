"""One attempt of a sweep, once its driver holds the run's token and its assignment (``workers.tune.driver``): runs
Ray Tune over it (``workers.tune.tuner``) and reports the sweep's state and every trial's news. Attempt 2 and later
restore Tune's experiment from storage: finished trials are not run again, unfinished ones resume from their
latest checkpoints (a preempted sweep's paused trials: from their preemption checkpoints,
``workers.tune.preemption``). Imported by the driver after its claim, as ``workers.train.attempt``."""

from __future__ import annotations

import logging
import traceback

from ray import tune

from orchestrator_contract.jobs import DriverExit, StartupEvent, StateEvent
from orchestrator_contract.sweeps import SweepAssignment
from workers.runtime.claim import RunToken
from workers.runtime.reporter import EventReporter
from workers.train.attempt import MAX_MESSAGE_CHARS, finish_reporting
from workers.tune.preemption import PREEMPTIONS, PreemptionWatch, SweepControl, SweepPreemption, markers_folder
from workers.tune.tuner import (
    REPORTERS,
    TUNE_EXPERIMENT,
    TrialEventForwarder,
    param_space,
    search_algorithm,
    sweep_folder,
    trainable,
    trial_scheduler,
    tune_checkpoint_config,
)

log = logging.getLogger("workers.tune.driver")


def build_tuner(assignment: SweepAssignment, callbacks: list, control: SweepControl | None = None) -> tune.Tuner:
    spec, sweep_id = assignment.spec, assignment.sweep_id
    folder = sweep_folder(assignment.storage_path, sweep_id)
    # The trials' ranks poll the sweep's control: rank 0 for its preemption and their deadlines (stop_trials),
    # every rank for requests for its stacks and the end of a hung trial's workers (services.trial_hangs).
    trial_control = {**control.as_config(), "preemptible": spec.may_be_preempted} if control else None
    fn = trainable(spec, assignment.storage_path, sweep_id, trial_control, assignment.avoid_nodes)
    experiment = f"{folder}/{TUNE_EXPERIMENT}"
    if assignment.attempt > 1 and tune.Tuner.can_restore(experiment):
        log.info("sweep %s attempt %d: restoring Tune's experiment from %s", sweep_id, assignment.attempt, experiment)
        # Errored trials stay failed (their error was reported); unfinished ones resume. The callbacks come
        # back from the experiment state (the first attempt's, PreemptionWatch included).
        return tune.Tuner.restore(experiment, trainable=fn, resume_unfinished=True, resume_errored=False)
    return tune.Tuner(
        fn,
        param_space=param_space(spec),
        tune_config=tune.TuneConfig(
            metric=spec.metric,
            mode=spec.mode,
            search_alg=search_algorithm(spec),
            scheduler=trial_scheduler(spec),
            num_samples=spec.num_samples,
            max_concurrent_trials=spec.max_concurrent_trials,
        ),
        run_config=tune.RunConfig(
            name=TUNE_EXPERIMENT,
            storage_path=folder,
            # A trial's worker failures are retried inside it (retries.max_worker_restarts); a trial that
            # still fails is reported FAILED and the search goes on.
            failure_config=tune.FailureConfig(max_failures=0),
            checkpoint_config=tune_checkpoint_config(spec),
            callbacks=callbacks,
            verbose=1,
        ),
    )


def run_sweep(assignment: SweepAssignment, control_plane_url: str | None, token: RunToken | str) -> int:
    sweep_id, attempt, spec = assignment.sweep_id, assignment.attempt, assignment.spec
    log.info(
        "sweep %s attempt %d: %s search, %s scheduler, %d trial(s), %d at a time, %s %s",
        sweep_id,
        attempt,
        spec.algorithm,
        spec.scheduler.type,
        spec.total_trials,
        spec.max_concurrent_trials,
        spec.mode,
        spec.metric,
    )
    reporter = REPORTERS[sweep_id] = EventReporter(control_plane_url, sweep_id, attempt, token, collection="sweeps")
    reporter.emit(
        StateEvent(state="running", reason="sweep_started", message=f"attempt {attempt}: Ray Tune is running")
    )
    preemption, control = None, None
    # The trials' ranks poll the sweep's control for its preemption, their deadlines and their hangs.
    watched = (
        spec.may_be_preempted or spec.base.max_runtime_s is not None or spec.base.failure.hang_timeout_s is not None
    )
    if control_plane_url and token and watched:
        markers = markers_folder(sweep_folder(assignment.storage_path, sweep_id), attempt)
        control = SweepControl(control_plane_url, sweep_id, attempt, token, markers)
    if control is not None and spec.may_be_preempted:
        preemption = PREEMPTIONS[sweep_id] = SweepPreemption(control)
    callbacks = [TrialEventForwarder(sweep_id, spec), PreemptionWatch(sweep_id)]
    try:
        tuner = build_tuner(assignment, callbacks, control)
        reporter.emit(StartupEvent(stage="trainer_started"))  # its start-up timeline: Ray Tune starts now
        results = tuner.fit()
    except Exception as exc:
        log.error("sweep %s attempt %d: Ray Tune failed:\n%s", sweep_id, attempt, traceback.format_exc())
        reporter.emit(
            StateEvent(
                state="failed", reason="sweep_error", message=f"{type(exc).__name__}: {exc}"[-MAX_MESSAGE_CHARS:]
            )
        )
        exit_code = DriverExit.TRAINING_FAILED
    else:
        if preemption is not None and preemption.interrupted:
            # Tune saved its state with the paused trials unfinished: no outcome, the control plane requeues.
            log.info("sweep %s attempt %d preempted: trials paused, Tune's state saved", sweep_id, attempt)
            preemption.close()
            finish_reporting(reporter)
            return DriverExit.PREEMPTED
        failed = results.num_errors
        if failed and failed == len(results):
            first = next(r.error for r in results if r.error is not None)
            reporter.emit(
                StateEvent(
                    state="failed",
                    reason="all_trials_failed",
                    message=f"every trial ({failed}) failed; the first: {first}"[-MAX_MESSAGE_CHARS:],
                )
            )
            exit_code = DriverExit.TRAINING_FAILED
        else:
            summary = f"{len(results)} trial(s), {failed} failed"
            reporter.emit(
                StateEvent(
                    state="succeeded",
                    reason="completed",
                    message=summary,
                    result={"trials": len(results), "failed": failed},
                )
            )
            log.info("sweep %s attempt %d succeeded: %s", sweep_id, attempt, summary)
            exit_code = DriverExit.SUCCEEDED
    if preemption is not None:
        preemption.close()
    finish_reporting(reporter)
    return exit_code
