"""A run's own report of its end is applied when Ray confirms that its Ray job ended (docs/security.md, finding 2).

A job's or sweep's driver reports ``succeeded`` (with its result) or ``failed`` (with its cause) just before it
exits. Anybody holding the run's token could send the same report while the Ray job goes on, and applying it at
once stopped the run's usage clock, gave its CPUs to the next run and put a made-up result on it, with nothing
stopping the Ray job. So such a report is held (``hold``: ``reported_end`` on the run, which stays where it is,
accounted and holding its resources), and applied (``apply_if_confirmed``) only once Ray says the attempt's Ray
job ended the way the report says:

    succeeded   Ray says SUCCEEDED (the driver exited 0)
    failed      Ray says FAILED with the driver's own exit status for it (``DriverExit.TRAINING_FAILED``)

The events route asks Ray once right after it holds a report (a report that arrives after the driver exited is
applied at once); otherwise the reconciler applies it at its next look at the run after the driver exits, which
an honest driver does seconds after its report. When Ray says the job ended otherwise (FAILED with another
status, STOPPED), the report is dropped (``drop_unconfirmed``, logged as a warning) and the reconciler decides
from Ray's word alone, as for a driver whose report never arrived: a new attempt, or FAILED; never the reported
end or its result. A new attempt forgets what an old one reported (``services.launch.new_driver_claim``).
"""

from __future__ import annotations

import logging
from typing import Any

from orchestrator.backend import RunInfo, RunStatus
from orchestrator.db.models import Job, JobState, Sweep
from orchestrator.states.core import IllegalTransition
from orchestrator.states.jobs import is_allowed, note_waiting
from orchestrator_contract.jobs import DriverExit, StateEvent

log = logging.getLogger(__name__)

Run = Job | Sweep
ENDS = {"succeeded": JobState.SUCCEEDED, "failed": JobState.FAILED}  # the reports that are held
END_REPORTED = "end_reported"  # the run's reason while its report waits for Ray
# How Ray says the Ray job ended when it ended as reported: its status, and the driver's exit status (None: any).
CONFIRMED_BY: dict[str, tuple[RunStatus, int | None]] = {
    "succeeded": (RunStatus.SUCCEEDED, None),
    "failed": (RunStatus.FAILED, int(DriverExit.TRAINING_FAILED)),
}
_NOTED_WHILE = frozenset({JobState.STARTING, JobState.RUNNING, JobState.RESTARTING})


def is_end(event: StateEvent) -> bool:
    return event.state in ENDS


def held(run: Run) -> dict[str, Any] | None:
    """The end the run's current attempt reported and Ray has not confirmed yet; None if none."""
    pending = run.reported_end
    if not pending or pending.get("attempt") != run.attempt:
        return None
    return pending


def hold(kind: str, run: Run, event: StateEvent, reason: str) -> bool:
    """Keep ``event`` (a locked run's report of its end; ``reason``: its reason, or the default one) until Ray
    confirms it. Returns whether that changed anything: a repeat (a retried batch) does not. A report the rules
    would refuse now (a late one, or ``failed`` while the run is being cancelled) is ignored, as it always was."""
    to_state = ENDS[event.state]
    if not is_allowed(run.state, to_state):
        log.info("ignoring reported state: %s %s cannot go from %s to %s", kind, run.id, run.state, to_state)
        return False
    pending = {
        "attempt": run.attempt,
        "state": event.state,
        "reason": reason,
        "message": event.message,
        "result": event.result,
    }
    if run.reported_end == pending:
        return False
    if held(run) is not None:
        log.info("%s %s attempt %d reported its end again, differently: %s", kind, run.id, run.attempt, event.state)
    run.reported_end = pending
    if run.state in _NOTED_WHILE and run.preempt_requested_at is None:  # a cancel or a preemption says its own
        note_waiting(
            run,
            END_REPORTED,
            f"its driver reported that it {event.state} ({pending['reason']}); applied once Ray confirms that the "
            "Ray job ended",
        )
    log.info("%s %s attempt %d reported that it %s: held until Ray confirms", kind, run.id, run.attempt, event.state)
    return True


def confirms(pending: dict[str, Any], info: RunInfo) -> bool:
    status, exit_code = CONFIRMED_BY[pending["state"]]
    return info.status == status and (exit_code is None or info.exit_code == exit_code)


def apply_if_confirmed(session, kind, run: Run, info: RunInfo) -> bool:
    """The held end of the locked ``run`` (of ``kind``, a ``services.runs.RunKind``), applied through its
    transition function when ``info`` (Ray's word on the run's current submission) confirms it. Returns whether
    it was applied; False changes nothing (nothing held, Ray not agreeing, or the rules no longer allowing it)."""
    pending = held(run)
    if pending is None or not confirms(pending, info):
        return False
    try:
        changed = kind.set_state(session, run, ENDS[pending["state"]], pending["reason"], pending["message"])
    except IllegalTransition as exc:
        log.info("not applying %s %s's reported end: %s", kind.name, run.id, exc)
        return False
    run.reported_end = None
    # Only with the transition it came with: an ended run's result is never rewritten.
    if changed and isinstance(run, Job) and pending["result"] is not None:
        run.result = pending["result"]
    return True


def drop_unconfirmed(kind_name: str, run: Run, info: RunInfo) -> str:
    """Once Ray says the Ray job ended (``info``) and ``apply_if_confirmed`` did not apply the held end, forget it:
    a driver that failed after its report, or a report that was never its driver's. Returns a line for the
    message of what the run becomes instead ("" when nothing was held, or Ray says the job has not ended)."""
    if not info.status.finished:
        return ""  # Ray has not said its word yet: still held
    pending = held(run)
    run.reported_end = None
    if pending is None:
        return ""
    exit_code = "" if info.exit_code is None else f" (exit status {info.exit_code})"
    line = f"its own report that it {pending['state']} was not confirmed: Ray says the job {info.status}{exit_code}"
    log.warning("%s %s attempt %d: %s", kind_name, run.id, run.attempt, line)
    return line
