"""How a ``SweepSpec`` becomes a Ray Tune ``Tuner`` whose trials are our training jobs.

Each trial is a function trainable that fits a ``TorchTrainer`` (``workers.trainer.build_trainer``, the
same runtime as a job: DDP/FSDP, checkpoints, worker restarts by cause) with Ray Train's
``TuneReportCallback``: every epoch checkpoint becomes one Tune result, which the scheduler compares
(``time_attr`` is our ``epoch``, which keeps counting when a trial resumes from its checkpoint).
"""

from __future__ import annotations

import logging
from typing import Any

import ray.tune
from ray import tune
from ray.train import CheckpointConfig
from ray.tune.integration.ray_train import CHECKPOINT_PATH_KEY, TuneReportCallback
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, TrialScheduler
from ray.tune.search import BasicVariantGenerator, Searcher

from workers.reporter import EventReporter
from workers.spec import CHECKPOINT_METRICS, JobSpec, TrainingPlan
from workers.sweep_spec import (
    TRIAL_DRIVER_CPU,
    AshaScheduler,
    Choice,
    Grid,
    LogUniform,
    QUniform,
    RandInt,
    SweepSpec,
    TrialEvent,
    Uniform,
    trial_spec,
)
from workers.trainer import build_trainer

log = logging.getLogger(__name__)

TUNE_EXPERIMENT = "tune"  # <storage>/<sweep>/tune: Tune's experiment state, for Tuner.restore
TRIALS_FOLDER = "trials"  # <storage>/<sweep>/trials/<trial>: each trial's Ray Train run and checkpoints


def sweep_folder(storage_path: str, sweep_id: str) -> str:
    return f"{storage_path.rstrip('/')}/{sweep_id}"


def param_space(spec: SweepSpec) -> dict[str, Any]:
    """The search space in Tune's terms, keyed by the same dotted paths."""
    space: dict[str, Any] = {}
    for path, dim in spec.search_space.items():
        if isinstance(dim, Choice):
            space[path] = tune.choice(dim.values)
        elif isinstance(dim, Grid):
            space[path] = tune.grid_search(dim.values)
        elif isinstance(dim, QUniform):
            space[path] = tune.quniform(dim.low, dim.high, dim.q)
        elif isinstance(dim, Uniform):
            space[path] = tune.uniform(dim.low, dim.high)
        elif isinstance(dim, LogUniform):
            space[path] = tune.loguniform(dim.low, dim.high)
        elif isinstance(dim, RandInt):
            space[path] = tune.randint(dim.low, dim.high)
        else:  # pragma: no cover - the spec's union is closed
            raise TypeError(f"unknown dimension {dim!r}")
    return space


def search_algorithm(spec: SweepSpec) -> Searcher | BasicVariantGenerator:
    if spec.algorithm == "optuna":
        from optuna.samplers import TPESampler
        from ray.tune.search.optuna import OptunaSearch

        return OptunaSearch(sampler=TPESampler(seed=spec.seed))
    # random and grid: Tune's variant generator; seeded, so the same seed samples the same configs. Tune
    # ignores TuneConfig.max_concurrent_trials for a generator passed in: it takes its own.
    return BasicVariantGenerator(max_concurrent=spec.max_concurrent_trials, random_state=spec.seed)


def trial_scheduler(spec: SweepSpec) -> TrialScheduler:
    if isinstance(spec.scheduler, AshaScheduler):
        return ASHAScheduler(
            time_attr="epoch",
            max_t=spec.scheduler.max_t,
            grace_period=spec.scheduler.grace_period,
            reduction_factor=spec.scheduler.reduction_factor,
        )
    return FIFOScheduler()


def run_trial(config: dict[str, Any], *, base: dict, trials_storage: str, metric: str, mode: str, keep: int) -> None:
    """The function trainable: one trial is one Ray Train run, named after Tune's trial id, so a trial that
    Tune restarts (a new sweep driver) resumes that run's latest checkpoint."""
    spec = trial_spec(JobSpec.model_validate(base), config)
    trial_id = ray.tune.get_context().get_trial_id()
    trainer = build_trainer(
        job_id=trial_id,
        attempt=1,
        spec=spec,
        plan=TrainingPlan.fixed(spec),
        storage_path=trials_storage,
        control_plane_url=None,  # a trial's news reaches the control plane through Tune (TrialEventForwarder)
        token="",
        # No control-plane retention for trials: Ray keeps the best `keep` by the sweep's metric.
        checkpoint_config=CheckpointConfig(
            num_to_keep=keep, checkpoint_score_attribute=metric, checkpoint_score_order=mode
        ),
        extra_callbacks=[TuneReportCallback()],
    )
    trainer.fit()


def trainable(spec: SweepSpec, storage_path: str, sweep_id: str):
    fn = tune.with_parameters(
        run_trial,
        base=spec.base.model_dump(mode="json"),
        trials_storage=f"{sweep_folder(storage_path, sweep_id)}/{TRIALS_FOLDER}",
        metric=spec.metric,
        mode=spec.mode,
        keep=spec.base.checkpoint.keep,
    )
    # The trial's own actor only drives its TorchTrainer; the workers hold the real resources.
    return tune.with_resources(fn, {"CPU": TRIAL_DRIVER_CPU})


# The sweep driver's reporter, by sweep id. Tune pickles its callbacks into the experiment state (and
# Tuner.restore unpickles them), and a reporter's thread can't be pickled: callbacks look it up here.
REPORTERS: dict[str, EventReporter] = {}


class TrialEventForwarder(tune.Callback):
    """Runs in the sweep driver's Tune loop: tells the control plane about every trial as it happens,
    through the driver's one reporter (``REPORTERS``), so trial news and the sweep's end arrive in order."""

    def __init__(self, sweep_id: str, spec: SweepSpec):
        self.sweep_id = sweep_id
        self.spec = spec

    @property
    def reporter(self) -> EventReporter:
        return REPORTERS[self.sweep_id]

    def _config(self, trial) -> dict[str, Any]:
        return {path: trial.config.get(path) for path in self.spec.search_space}

    def on_trial_start(self, iteration, trials, trial, **info) -> None:
        self.reporter.emit(TrialEvent(trial=trial.trial_id, state="running", config=self._config(trial)))

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        if "epoch" not in result:
            return
        metrics = {k: float(result[k]) for k in CHECKPOINT_METRICS if isinstance(result.get(k), (int, float))}
        self.reporter.emit(
            TrialEvent(
                trial=trial.trial_id, state="running", config=self._config(trial),
                epoch=int(result["epoch"]), step=int(result.get("step", 0)), metrics=metrics,
                checkpoint_path=result.get(CHECKPOINT_PATH_KEY),
            )
        )

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        epochs = trial_spec(self.spec.base, self._config(trial)).epochs
        ran = int((trial.last_result or {}).get("epoch", 0))
        state = "succeeded" if ran >= epochs else "stopped"
        message = "" if state == "succeeded" else f"stopped by the scheduler after {ran} of {epochs} epochs"
        self.reporter.emit(TrialEvent(trial=trial.trial_id, state=state, config=self._config(trial), message=message))

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        error = trial.get_pickled_error() or trial.get_error()
        self.reporter.emit(
            TrialEvent(trial=trial.trial_id, state="failed", config=self._config(trial), message=str(error)[-15_000:])
        )
