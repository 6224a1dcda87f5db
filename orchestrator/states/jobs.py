"""Job rules: the run lifecycle (jobs and sweeps, ``orchestrator.states.sweeps``) and its companion fields.

QUEUED -> STARTING -> RUNNING <-> RESTARTING -> SUCCEEDED | FAILED | CANCELLED
CANCELLING between a cancel request and the end; terminal states are final. A job or a sweep that is
STARTING, RUNNING or RESTARTING may go back to QUEUED when it is preempted (reason ``preempted`` only).
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from orchestrator.db.models import Job, JobEvent, JobState
from orchestrator.states.core import (
    Change,
    Lifecycle,
    Rule,
    allowed,
    lock_row,
    record_creation,
    record_request,
    transition,
)
from orchestrator.states.job_metrics import count_change, count_submitted
from orchestrator.states.startup import startup_after
from orchestrator.states.usage_ledger import job_usage

S = JobState
TERMINAL: frozenset[JobState] = frozenset({S.SUCCEEDED, S.FAILED, S.CANCELLED})
ACTIVE: frozenset[JobState] = frozenset({S.STARTING, S.RUNNING, S.RESTARTING, S.CANCELLING})

# FROM -> TO. A CANCELLING job may still finish on its own (SUCCEEDED), but a failure reported while
# it is being stopped is the stop itself, so CANCELLING -> FAILED is not a rule: it ends CANCELLED.
RULES: tuple[Rule, ...] = (
    Rule(frozenset({S.QUEUED}), frozenset({S.STARTING, S.CANCELLED, S.FAILED})),
    Rule(
        frozenset({S.STARTING}), frozenset({S.RUNNING, S.RESTARTING, S.SUCCEEDED, S.FAILED, S.CANCELLING, S.CANCELLED})
    ),
    Rule(frozenset({S.RUNNING}), frozenset({S.RESTARTING, S.SUCCEEDED, S.FAILED, S.CANCELLING})),
    # RESTARTING -> RESTARTING: a second failure before the job ran again (recorded with again=True).
    Rule(frozenset({S.RESTARTING}), frozenset({S.RESTARTING, S.RUNNING, S.SUCCEEDED, S.FAILED, S.CANCELLING})),
    Rule(frozenset({S.CANCELLING}), frozenset({S.CANCELLED, S.SUCCEEDED})),
)

# Preemption (jobs and sweeps, ``orchestrator.services.preemption``): an active run that is not being cancelled
# goes back to QUEUED, always with reason ``preempted`` (``requeue_before`` refuses any other), once its
# Ray job is gone. Admission then starts its next attempt, which resumes from its latest checkpoint.
PREEMPTED = "preempted"
PREEMPTING = "preempting"  # the reason of a run asked to checkpoint now and stop (``request_preemption``)
DRIVER_REVOKED = "driver_revoked"  # the reason of a run whose driver's token and claim were revoked
# A deadline (``max_runtime_s``, ``orchestrator.services.deadlines``) stops a run the way a preemption does
# (checkpoint now, then stop), but the run then ends FAILED ``deadline_exceeded`` instead of going back to QUEUED.
DEADLINE_REACHED = "deadline_reached"  # the reason of a run asked to stop at its deadline
DEADLINE_EXCEEDED = "deadline_exceeded"  # the reason it ends FAILED with
DEADLINE = "its deadline (max_runtime_s)"  # the ``preempt_by`` of a run stopping at its deadline
# Hang detection (``orchestrator.services.hangs``, jobs only): a RUNNING job without progress is asked for every
# rank's stack (a request row), then ends its attempt ``hung``; progress meanwhile clears the suspicion (a row too).
HANG_SUSPECTED = "hang_suspected"
PROGRESS_RESUMED = "progress_resumed"
HUNG = "hung"
STRAGGLER = "straggler"  # a request row: a rank found slower than the others (``orchestrator.services.stragglers``)
# ``failure.on_straggler: restart``: the job is asked to checkpoint now and stop, as a preemption asks (a request
# row, reason ``straggler_restart``); once its Ray job is gone the reconciler starts its next attempt (reason
# ``straggler_restarted``, counted against retries.max_attempts), placed without the straggler's node.
STRAGGLER_RESTART = "straggler_restart"
STRAGGLER_RESTARTED = "straggler_restarted"
STRAGGLER_BY = "a straggler (failure.on_straggler: restart)"  # the ``preempt_by`` of such a stop
# The reasons of a run's history rows that record a request, not a transition (``core.record_request``):
# ``last_transition`` skips them, so the reconciler's clocks and "not heard from" still read the transitions.
REQUESTS: frozenset[str] = frozenset(
    {PREEMPTING, DRIVER_REVOKED, DEADLINE_REACHED, HANG_SUSPECTED, PROGRESS_RESUMED, STRAGGLER, STRAGGLER_RESTART}
)
PREEMPTED_RULE: Rule = Rule(frozenset({S.STARTING, S.RUNNING, S.RESTARTING}), frozenset({S.QUEUED}))
JOB_RULES: tuple[Rule, ...] = (*RULES, PREEMPTED_RULE)


def is_allowed(from_state: JobState, to_state: JobState) -> bool:
    return allowed(JOB_RULES, from_state, to_state)


# --- the run companions (jobs and sweeps) ------------------------------------------------------------


def attempt_before(_session: Session, change: Change) -> None:
    """Before the history row: admission (QUEUED -> STARTING) starts attempt + 1, and its row records it."""
    if change.new_attempt and change.to_state != S.RESTARTING:
        raise ValueError(f"only a move to RESTARTING starts a new attempt, not to {change.to_state}")
    if change.from_state == S.QUEUED and change.to_state == S.STARTING:
        change.row.attempt += 1


def attempt_after(_session: Session, change: Change) -> None:
    """After the history row: a restart into a new driver (``new_attempt``) bumps the attempt, so its row
    records the attempt that was lost (the reconciler reads that: a RESTARTING run whose last transition
    carries a lower attempt than the run has not been heard from since the new submission)."""
    if change.new_attempt:
        change.row.attempt += 1


def lifecycle_times(_session: Session, change: Change) -> None:
    """The first RUNNING sets started_at; a terminal state sets finished_at and revokes the driver's token."""
    run = change.row
    if change.to_state == S.RUNNING and run.started_at is None:
        run.started_at = change.at
    if change.to_state in TERMINAL:
        run.finished_at = change.at
        # A run's token acts for that run only while it runs: its driver has sent its last word.
        run.token_hash = ""


def queued_since(_session: Session, change: Change) -> None:
    """Entering QUEUED (the creation, a preemption's requeue) sets ``queued_at``: the starvation guard counts
    a run's wait from there, so a requeued run does not claim the reservation for its first wait."""
    if change.to_state == S.QUEUED:
        change.row.queued_at = change.at


def preempted_record(_session: Session, change: Change) -> None:
    """Back to QUEUED preempted: remember when and by whom (``last_preempted_at``/``_by``), which outlive the
    ``preempted`` reason once the run waits for something else. Before ``preemption_after`` forgets preempt_by."""
    run = change.row
    if change.to_state == S.QUEUED and change.from_state is not None:
        run.last_preempted_at = change.at
        run.last_preempted_by = run.preempt_by or "the scheduler"


def requeue_before(_session: Session, change: Change) -> None:
    """Back to QUEUED only preempted: no other cause may put a started job back in the queue."""
    if change.to_state == S.QUEUED and change.from_state is not None and change.reason != PREEMPTED:
        raise ValueError(f"a job goes back to QUEUED only {PREEMPTED!r}, not {change.reason!r}")


def preemption_after(_session: Session, change: Change) -> None:
    """A preempted job counts its preemption (attempts that do not use its retry budget) and forgets the
    request; any end forgets it too. The driver token stays: a late event of the stopped attempt (its last
    checkpoint) still lands, and admission gives the next attempt a new one."""
    job = change.row
    if change.to_state == S.QUEUED and change.from_state is not None:
        job.preemptions = (job.preemptions or 0) + 1
    if change.to_state == S.QUEUED or change.to_state in TERMINAL or change.new_attempt:
        job.preempt_requested_at = None  # a new attempt (a straggler's restart) is not asked to stop
        job.preempt_by = ""


def stacks_forgotten(_session: Session, change: Change) -> None:
    """Any move out of RUNNING ends a hang suspicion (the stacks asked for belong to the attempt that was hung);
    a new attempt starts with no stragglers (its workers may be placed elsewhere)."""
    job = change.row
    if change.to_state != S.RUNNING:
        job.stacks_requested_at = None
        job.stacks = None
    if change.new_attempt or change.to_state == S.QUEUED:
        job.stragglers = None
        job.straggler_windows = None


def _job_history(_session: Session, change: Change) -> JobEvent:
    job = change.row
    return JobEvent(
        job_id=job.id,
        from_state=change.from_state,
        to_state=change.to_state,
        reason=change.reason,
        message=change.message,
        attempt=job.attempt,
    )


JOB_LIFECYCLE = Lifecycle(
    kind="job",
    rules=JOB_RULES,
    initial=S.QUEUED,
    terminal=TERMINAL,
    history=_job_history,
    before=(attempt_before, requeue_before),
    # count_change last: it reads the times lifecycle_times sets.
    after=(
        attempt_after,
        startup_after,
        lifecycle_times,
        queued_since,
        preempted_record,
        preemption_after,
        stacks_forgotten,
        count_change,
        job_usage,
    ),
    on_create=(queued_since, count_submitted),
    attempts=True,
)


def lock_job(session: Session, job_id: str) -> Job | None:
    """Load a job with its row locked for the rest of the transaction (SQLite: BEGIN IMMEDIATE)."""
    return lock_row(session, Job, job_id)


def set_job_state(
    session: Session,
    job: Job,
    to_state: JobState,
    reason: str,
    message: str = "",
    again: bool = False,
    new_attempt: bool = False,
) -> bool:
    """Move ``job`` (already locked with ``lock_job``) to ``to_state`` and record why.

    Returns False, changing nothing, when the job is already there (events are retried, so a repeat
    is normal) unless ``again`` says the repeat is itself news (a second restart). ``new_attempt``: this
    move to RESTARTING submits a new driver (attempt + 1). Raises IllegalTransition for a move the rules
    forbid. Never commits: the caller's transaction covers the job, its history row and whatever else the
    caller changed with it.
    """
    return transition(session, JOB_LIFECYCLE, job, to_state, reason, message, again=again, new_attempt=new_attempt)


def record_job_created(session: Session, job: Job) -> None:
    """The history row of a job just submitted (QUEUED). Never commits."""
    record_creation(session, JOB_LIFECYCLE, job, "submitted")


def _ask_to_stop(session: Session, lifecycle: Lifecycle, run: Job, by: str, reason: str, message: str) -> None:
    """``run`` (locked) is asked to checkpoint now and stop: ``preempt_requested_at``/``preempt_by`` set, and a
    history row with ``reason`` (one of ``REQUESTS``)."""

    def ask(_session: Session, change: Change) -> None:
        run.preempt_requested_at = change.at
        run.preempt_by = by[:256]

    record_request(session, lifecycle, run, reason, message, ask)


def request_preemption(session: Session, lifecycle: Lifecycle, run: Job, by: str) -> None:
    """Ask ``run`` (a job, or a sweep with its lifecycle; locked) to checkpoint now and stop, ``by`` naming the
    preemptor: ``preempt_requested_at``/``preempt_by`` set, a history row (reason ``preempting``). The reconciler
    moves it back to QUEUED (``preempted``) once its Ray job is gone; ``preemption_after`` forgets the request."""
    _ask_to_stop(session, lifecycle, run, by, PREEMPTING, f"preempted by {by[:256]}: asked to checkpoint now and stop")


def request_deadline_stop(session: Session, lifecycle: Lifecycle, run: Job, message: str) -> None:
    """Ask ``run`` (a job or a sweep, locked) to checkpoint now and stop because it reached its deadline: the
    preemption's request with ``preempt_by`` = ``DEADLINE`` and a history row of its own (reason
    ``deadline_reached``). The reconciler ends it FAILED ``deadline_exceeded`` once its Ray job is gone."""
    _ask_to_stop(session, lifecycle, run, DEADLINE, DEADLINE_REACHED, message)


def request_straggler_restart(session: Session, job: Job, message: str) -> None:
    """Ask ``job`` (locked, RUNNING) to checkpoint now and stop because of a straggler (``failure.on_straggler:
    restart``): the preemption's request with ``preempt_by`` = ``STRAGGLER_BY`` and a history row of its own."""
    _ask_to_stop(session, JOB_LIFECYCLE, job, STRAGGLER_BY, STRAGGLER_RESTART, message)


def request_stacks(session: Session, job: Job, message: str) -> None:
    """Ask every rank of ``job`` (locked, RUNNING) for its Python stack: ``stacks_requested_at`` set (the
    control signal's ``stacks_wanted``), the answers so far emptied, a history row (reason ``hang_suspected``)."""

    def ask(_session: Session, change: Change) -> None:
        job.stacks_requested_at = change.at
        job.stacks = {}

    record_request(session, JOB_LIFECYCLE, job, HANG_SUSPECTED, message, ask)


def clear_hang_suspicion(session: Session, job: Job, message: str) -> None:
    """``job`` (locked) made progress after its stacks were asked for: not hung after all (a history row, reason
    ``progress_resumed``)."""

    def clear(_session: Session, _change: Change) -> None:
        job.stacks_requested_at = None
        job.stacks = None

    record_request(session, JOB_LIFECYCLE, job, PROGRESS_RESUMED, message, clear)


def record_straggler(session: Session, job: Job, entry: dict, message: str) -> None:
    """``job`` (locked) has a straggler: ``entry`` (rank, ratio, step...) added to its ``stragglers``, a history row
    (reason ``straggler``)."""

    def add(_session: Session, _change: Change) -> None:
        job.stragglers = [*(job.stragglers or []), entry]  # a new list: the JSON column sees the change

    record_request(session, JOB_LIFECYCLE, job, STRAGGLER, message, add)


def revoke_driver(session: Session, lifecycle: Lifecycle, run: Job, why: str) -> None:
    """No driver of ``run`` (locked) may report, or claim its token, any more: its claim code and token are
    revoked, with a history row (reason ``driver_revoked``); its next attempt gets a new claim code."""

    def revoke(_session: Session, _change: Change) -> None:
        run.token_hash = ""
        run.claim_hash = ""

    record_request(session, lifecycle, run, DRIVER_REVOKED, f"{why}: its driver's token is revoked", revoke)


def issue_driver_claim(run: Job, claim_hash: str) -> None:
    """A new attempt (or a new submission of it) of ``run`` (locked): its driver claims with the code hashed to
    ``claim_hash``; the old driver's token stops working now and an end it reported but Ray never confirmed is
    forgotten. The transition that starts the attempt (or the resubmission's log line) is its record."""
    run.claim_hash = claim_hash
    run.claimed_by = ""
    run.token_hash = ""
    run.reported_end = None


def issue_driver_token(run: Job, token_hash: str, nonce_hash: str) -> None:
    """The claim exchange (``services.run_claims.exchange``, checks done, ``run`` locked): the token hashed to
    ``token_hash`` now acts for ``run``, for the driver that sent the nonce hashed to ``nonce_hash``."""
    run.token_hash = token_hash
    run.claimed_by = nonce_hash


def note_waiting(run: Job, reason: str, message: str, waiting_on: str | None = None) -> None:
    """Say why a job (or sweep) stays where it is (e.g. QUEUED for resources), and for a queued one which cluster it
    waits for: no transition, no history row."""
    if (run.reason, run.message) != (reason, message):
        run.reason = reason
        run.message = message
    if run.waiting_on != waiting_on:
        run.waiting_on = waiting_on
