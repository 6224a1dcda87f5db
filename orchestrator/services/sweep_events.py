"""Applying what a sweep's driver reports: the sweep's own state, and each trial's news."""

from __future__ import annotations

import logging

from sqlalchemy.orm import Session

from orchestrator.db.models import Sweep, Trial, TrialState
from orchestrator.repositories import sweeps as sweeps_repo
from orchestrator.services.events import DEFAULT_REASON, TARGET_STATE
from orchestrator.states import IllegalTransition
from orchestrator.sweep_states import set_sweep_state, set_trial_state
from workers.spec import StateEvent
from workers.sweep_spec import SweepEventBatch, SweepSpec, TrialEvent, trial_spec

log = logging.getLogger(__name__)

_TRIAL_TARGET = {
    "running": (TrialState.RUNNING, "started"),
    "succeeded": (TrialState.SUCCEEDED, "completed"),
    "stopped": (TrialState.STOPPED, "stopped_early"),
    "failed": (TrialState.FAILED, "trial_error"),
}


def apply_sweep_events(session: Session, sweep: Sweep, batch: SweepEventBatch) -> int:
    """Apply a batch to a locked sweep; returns how many events changed something. Idempotent, like a job's:
    a trial is keyed by Tune's trial id, a metric point by (trial, epoch)."""
    spec = SweepSpec.model_validate(sweep.spec)
    applied = 0
    for event in batch.events:
        if isinstance(event, TrialEvent):
            applied += _apply_trial(session, sweep, spec, event)
        elif isinstance(event, StateEvent):
            try:
                applied += set_sweep_state(
                    session, sweep, TARGET_STATE[event.state], event.reason or DEFAULT_REASON[event.state], event.message
                )
            except IllegalTransition as exc:
                log.info("ignoring reported state: %s", exc)
    _update_best(session, sweep, spec)
    return applied


def _apply_trial(session: Session, sweep: Sweep, spec: SweepSpec, event: TrialEvent) -> bool:
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
        changed = True
    if event.epoch is not None and event.metrics:
        sweeps_repo.record_trial_metric(session, trial, event.epoch, event.step or 0, event.metrics)
        trial.iterations = max(trial.iterations, event.epoch)
        trial.latest_metrics = {**event.metrics, "epoch": event.epoch}
        _consider_best_epoch(trial, spec, event)
        changed = True
    if event.state in _TRIAL_TARGET:
        to_state, reason = _TRIAL_TARGET[event.state]
        message = event.message
        if event.state == "stopped" and trial.iterations >= trial_spec(spec.base, trial.config).epochs:
            # A backstop: the driver judges by Tune's last result, and a restored trial whose Train run had
            # already finished reports it once more (workers/tuning.py: run_trial); should that result
            # still be missing, every epoch was recorded here, so the trial completed.
            to_state, reason, message = TrialState.SUCCEEDED, "completed", ""
        try:
            if set_trial_state(trial, to_state, reason, message):
                trial.stopped_early = to_state == TrialState.STOPPED
                changed = True
        except IllegalTransition as exc:  # a late report about a trial that already ended
            log.info("ignoring reported trial state: %s", exc)
    return changed


def _consider_best_epoch(trial: Trial, spec: SweepSpec, event: TrialEvent) -> None:
    value = event.metrics.get(spec.metric)
    if value is None:
        return
    if trial.best_metric is None or _better(value, trial.best_metric, spec.mode):
        trial.best_metric, trial.best_epoch = value, event.epoch
        trial.checkpoint_path = event.checkpoint_path


def _better(value: float, than: float, mode: str | None) -> bool:
    return value > than if mode == "max" else value < than


def _update_best(session: Session, sweep: Sweep, spec: SweepSpec) -> None:
    session.flush()
    scored = [t for t in sweeps_repo.list_trials(session, sweep.id) if t.best_metric is not None]
    if not scored:
        return
    # Ties go to the trial that got there first (the lower number).
    best = scored[0]
    for trial in scored[1:]:
        if _better(trial.best_metric, best.best_metric, spec.mode):
            best = trial
    sweep.best_trial_id = best.id
