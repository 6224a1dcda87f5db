"""Applying what a sweep's driver reports: the sweep's own state, and each trial's news."""

from __future__ import annotations

import logging

from sqlalchemy.orm import Session

from orchestrator.checkpoint_policy import best_first, score
from orchestrator.db.models import Sweep, Trial, TrialMetric, TrialState, utcnow
from orchestrator.repositories import sweeps as sweeps_repo
from orchestrator.services import reported_ends, stragglers, trial_hangs
from orchestrator.services.job_events import DEFAULT_REASON, TARGET_STATE, RefusedEvent, is_preemption_stop
from orchestrator.states import startup
from orchestrator.states.core import IllegalTransition
from orchestrator.states.sweeps import set_sweep_state, set_trial_state
from orchestrator.storage import CheckpointStorage
from orchestrator_contract.jobs import StacksEvent, StartupEvent, StateEvent
from orchestrator_contract.sweeps import SweepEventBatch, SweepSpec, TrialEvent, trial_spec, trials_folder

log = logging.getLogger(__name__)

_TRIAL_TARGET = {
    "running": (TrialState.RUNNING, "started"),
    "succeeded": (TrialState.SUCCEEDED, "completed"),
    "stopped": (TrialState.STOPPED, "stopped_early"),
    "failed": (TrialState.FAILED, "trial_error"),
}


def apply_sweep_events(
    session: Session,
    sweep: Sweep,
    batch: SweepEventBatch,
    storage: CheckpointStorage,
    straggler_windows: int = stragglers.DEFAULT_WINDOWS,
) -> int:
    """Apply a batch to a locked sweep; returns how many events changed something. Idempotent, like a job's:
    a trial is keyed by Tune's trial id, a metric point by (trial, epoch). RefusedEvent, before anything is
    applied, for a trial checkpoint outside that trial's own Train runs. ``straggler_windows``: the settings'
    (a trial's windows are its epochs, ``services.stragglers``)."""
    for event in batch.events:
        if isinstance(event, TrialEvent) and event.checkpoint_path:
            if storage.trial_run(sweep.id, event.trial, event.checkpoint_path) is None:
                raise RefusedEvent(
                    f"checkpoint {event.checkpoint_path} is not a checkpoint_* folder of trial "
                    f"{event.trial}'s runs in {storage.run_dir(trials_folder(sweep.id))}"
                )
    spec = SweepSpec.model_validate(sweep.spec)
    applied = 0
    for event in batch.events:
        if isinstance(event, TrialEvent):
            applied += _apply_trial(session, sweep, spec, event, straggler_windows)
        elif isinstance(event, StacksEvent):  # a trial's rank answers a request for its stacks (trial_hangs)
            applied += trial_hangs.record_stacks(session, sweep, event.model_dump())
        elif isinstance(event, StartupEvent):  # a stage of the attempt's start (states.startup)
            applied += startup.mark(sweep, event.stage)
        elif isinstance(event, StateEvent):
            if is_preemption_stop("sweep", sweep, event):
                continue
            if reported_ends.is_end(event):  # applied when Ray confirms, as a job's (services.reported_ends)
                applied += reported_ends.hold("sweep", sweep, event, event.reason or DEFAULT_REASON[event.state])
                continue
            try:
                applied += set_sweep_state(
                    session,
                    sweep,
                    TARGET_STATE[event.state],
                    event.reason or DEFAULT_REASON[event.state],
                    event.message,
                )
            except IllegalTransition as exc:
                log.info("ignoring reported state: %s", exc)
    update_best_trial(session, sweep, spec)
    return applied


def _apply_trial(session: Session, sweep: Sweep, spec: SweepSpec, event: TrialEvent, straggler_windows: int) -> bool:
    trial = sweeps_repo.find_trial(session, sweep.id, event.trial)
    changed = False
    if trial is None:
        trial = sweeps_repo.add_trial(session, sweep.id, event.trial, event.config or {})
        changed = True
    elif event.config and event.config != trial.config:
        # PBT continued the trial from another's checkpoint with that trial's config, perturbed: the trial
        # trains on under the new config (its metric history goes on; its earlier points stay).
        log.info("trial %s: config %s -> %s", trial.tune_id, trial.config, event.config)
        trial.config = dict(event.config)
        trial.straggler_windows = None  # a new Train run, on workers of its own: its slow epochs count anew
        changed = True
    # An epoch past every one recorded: not a re-sent one (a retried batch, a restored trial's last result again),
    # which must not count twice for stragglers.
    new_epoch = event.epoch is not None and event.epoch > trial.iterations
    if event.epoch is not None and event.metrics:
        sweeps_repo.record_trial_metric(
            session, trial, event.epoch, event.step or 0, event.metrics, event.checkpoint_path
        )
        trial.progress_at = utcnow()  # hang detection's evidence (services.trial_hangs)
        startup.mark_trial(trial, "first_result", trial.progress_at)
        trial.iterations = max(trial.iterations, event.epoch)
        trial.latest_metrics = {**event.metrics, "epoch": event.epoch}
        _consider_best(trial, spec, event)
        changed = True
    if event.state in _TRIAL_TARGET:
        to_state, reason = _TRIAL_TARGET[event.state]
        if event.state == "failed" and event.reason:
            reason = event.reason  # classified as a job's would be (code_error, oom, ...)
        message = event.message
        if event.state == "failed":  # its restarts' budget spent on hangs: hung (services.trial_hangs)
            reason, message = trial_hangs.failed_reason(session, trial, reason, message)
        if event.state == "stopped" and trial.iterations >= trial_spec(spec.base, trial.config).epochs:
            # A backstop: the driver judges by Tune's last result, and a restored trial whose Train run had
            # already finished reports it once more (workers/tune/tuner.py: run_trial); should that result
            # still be missing, every epoch was recorded here, so the trial completed.
            to_state, reason, message = TrialState.SUCCEEDED, "completed", ""
        try:
            if set_trial_state(session, trial, to_state, reason, message):
                trial.stopped_early = to_state == TrialState.STOPPED
                if to_state == TrialState.RUNNING:
                    startup.mark_trial(trial, "trial_started")
                changed = True
        except IllegalTransition as exc:  # a late report about a trial that already ended
            log.info("ignoring reported trial state: %s", exc)
    if new_epoch and event.rank_step_s and trial.state == TrialState.RUNNING:
        # Each rank's own time per step over the epoch (services.stragglers: a trial's windows are its epochs).
        stragglers.observe_trial(
            session,
            trial,
            trial_spec(spec.base, trial.config),
            event.epoch,
            event.step or 0,
            event.rank_step_s,
            straggler_windows,
        )
    return changed


def _consider_best(trial: Trial, spec: SweepSpec, event: TrialEvent) -> None:
    """``refresh_trial_best`` for one new epoch, without reading the trial's history again: the new point
    becomes the best when it has a checkpoint and the best has none, or when it is at least as good and both
    have one, or neither (the tie rule: the later epoch wins)."""
    value = score(event.metrics, spec.metric)
    if value is None:
        return
    has_checkpoint, best_has = bool(event.checkpoint_path), bool(trial.checkpoint_path)
    sign = 1.0 if (spec.mode or "max") == "max" else -1.0
    wins = (
        trial.best_metric is None
        or (has_checkpoint and not best_has)
        or (
            has_checkpoint == best_has
            and (sign * value, event.epoch) >= (sign * trial.best_metric, trial.best_epoch or 0)
        )
    )
    if wins:
        trial.best_metric, trial.best_epoch, trial.checkpoint_path = value, event.epoch, event.checkpoint_path


def refresh_trial_best(session: Session, trial: Trial, spec: SweepSpec) -> None:
    """The trial's best epoch by the sweep's metric (ties: the later, ``orchestrator.checkpoint_policy``)
    among the epochs whose checkpoint is still kept, with that checkpoint: what a deployment of the trial
    loads. Only when none is left, the best epoch of all, with no checkpoint."""
    session.flush()
    points = sweeps_repo.list_trial_metrics(session, trial.id)
    kept = [p for p in points if p.checkpoint_path]
    ranked = best_first(kept or points, spec.metric, spec.mode or "max", metrics=_values, order=_epoch)
    if not ranked:
        return
    best = ranked[0]
    trial.best_metric, trial.best_epoch = score(best.values, spec.metric), best.epoch
    trial.checkpoint_path = best.checkpoint_path


def _values(point: TrialMetric) -> dict:
    return point.values


def _epoch(point: TrialMetric) -> int:
    return point.epoch


def _better(value: float, than: float, mode: str | None) -> bool:
    return value > than if mode == "max" else value < than


def update_best_trial(session: Session, sweep: Sweep, spec: SweepSpec) -> None:
    session.flush()
    scored = [t for t in sweeps_repo.list_trials(session, sweep.id) if t.best_metric is not None]
    # A trial with a checkpoint left beats one without: the best trial is the one to deploy.
    scored = [t for t in scored if t.checkpoint_path] or scored
    if not scored:
        return
    # Ties go to the trial that got there first (the lower number).
    best = scored[0]
    for trial in scored[1:]:
        if _better(trial.best_metric, best.best_metric, spec.mode):
            best = trial
    sweep.best_trial_id = best.id
