"""How a ``SweepSpec`` becomes a Ray Tune ``Tuner`` whose trials are our training jobs.

Each trial is a function trainable that fits a ``TorchTrainer`` (``workers.train.trainer.build_trainer``, the
same runtime as a job: DDP/FSDP, checkpoints, worker restarts by cause) with Ray Train's
``TuneReportCallback``: every epoch checkpoint becomes one Tune result, which the scheduler compares
(``time_attr`` is our ``epoch``, which keeps counting when a trial resumes from its checkpoint).

Population based training needs more: Tune checkpoints it can hand from one trial to another, which
``TuneReportCallback`` does not make (it passes the Train checkpoint's path as a metric). A PBT trial fits
its trainer in a thread while ``CheckpointForwarder`` (in the Train controller) hands it each epoch's
metrics and checkpoint, which the trial reports to Tune as a Tune checkpoint (a copy). A trial that PBT
restarts from another's checkpoint with a perturbed learning rate starts a new Train run from a copy of it.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from collections.abc import Sequence
from typing import Any

import cloudpickle
import pyarrow.fs
import ray.tune
from ray import tune
from ray.train import Checkpoint, UserCallback
from ray.tune.error import TuneError
from ray.tune.integration.ray_train import CHECKPOINT_PATH_KEY, TuneReportCallback
from ray.tune.result import AUTO_RESULT_KEYS
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, PopulationBasedTraining, TrialScheduler
from ray.tune.search import BasicVariantGenerator, Searcher
from ray.util.queue import Empty, Queue

from orchestrator_contract.jobs import JobSpec, TrainingPlan
from orchestrator_contract.metrics import POSITION_KEYS
from orchestrator_contract.sweeps import (
    MAX_RANKS,
    RANK_STEP_S_KEY,
    TRIAL_DRIVER_RESOURCES,
    AshaScheduler,
    Choice,
    Grid,
    LogUniform,
    PbtScheduler,
    QUniform,
    RandInt,
    SweepSpec,
    TrialEvent,
    Uniform,
    trial_spec,
    trials_folder,
)
from workers.runtime.manifest import resolve
from workers.runtime.reporter import EventReporter
from workers.runtime.train_loop import DEADLINE_KEY, PREEMPTED_KEY
from workers.train.failures import TrialDeadlineExceeded, classify_trial_error
from workers.train.trainer import build_trainer
from workers.tune.preemption import is_epoch_result, pause_trial

log = logging.getLogger(__name__)

TUNE_EXPERIMENT = "tune"  # <storage>/<sweep>/tune: Tune's experiment state, for Tuner.restore
# Tune checkpoints kept per PBT trial (entries of Tune's list, not folders): a trial is cloned from its latest,
# and PBT warns at 2 or fewer (one could be deleted before the trial cloning it copies it). Ray 2.60 registers
# a checkpoint twice when PBT saves a trial in the top quantile (its own save, then the result's), so 8
# entries keep at least 4 epochs; deleting such a double a second time logs a FileNotFoundError from Tune.
PBT_TUNE_CHECKPOINTS = 8
START_FOLDER = "start"  # <trials>/<run>/start: the copy of the checkpoint a cloned trial's new run starts from


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
    if isinstance(spec.scheduler, PbtScheduler):
        return pbt_scheduler(spec, spec.scheduler)
    return FIFOScheduler()


def pbt_scheduler(spec: SweepSpec, pbt: PbtScheduler) -> PopulationBasedTraining:
    space = param_space(spec)
    mutations: dict[str, Any] = {}
    for path in pbt.mutate or ():
        dim = spec.search_space[path]
        # Tune multiplies a value drawn from a range and shifts one from a list: values to pick are a list.
        mutations[path] = list(dim.values) if isinstance(dim, (Choice, Grid)) else space[path]
    return EpochBoundPbt(
        epochs=spec.base.epochs,
        time_attr="epoch",
        perturbation_interval=pbt.perturbation_interval,
        hyperparam_mutations=mutations,
        quantile_fraction=pbt.quantile_fraction,
        resample_probability=pbt.resample_probability,
        custom_explore_fn=KeepInRange(spec, mutations),
    )


class EpochBoundPbt(PopulationBasedTraining):
    """Tune's PBT, left out of a trial's last epoch: saved there, a trial would be a donor with no epoch left,
    and a trial cloned from it would end at once, its own history stopping where it was (PBT can't search
    ``epochs``, so every trial has the same last one)."""

    def __init__(self, *, epochs: int, **kwargs):
        super().__init__(**kwargs)
        self.epochs = epochs

    def on_trial_result(self, tune_controller, trial, result: dict[str, Any]) -> str:
        if result.get("epoch", 0) >= self.epochs:
            return TrialScheduler.CONTINUE
        return super().on_trial_result(tune_controller, trial, result)


class KeepInRange:
    """PBT's explore step, after Tune's: a value multiplied by 1.2 or 0.8 stays within its dimension's
    range, where the spec checked that every value makes a valid job. A class: Tune pickles it."""

    def __init__(self, spec: SweepSpec, mutations: dict[str, Any]):
        self.bounds: dict[str, tuple[float, float]] = {}
        for path in mutations:
            dim = spec.search_space[path]
            if isinstance(dim, RandInt):
                self.bounds[path] = (dim.low, dim.high - 1)  # high is excluded
            elif isinstance(dim, (Uniform, QUniform, LogUniform)):
                self.bounds[path] = (dim.low, dim.high)

    def __call__(self, config: dict[str, Any]) -> dict[str, Any]:
        for path, (low, high) in self.bounds.items():
            if path in config:
                config[path] = min(max(config[path], low), high)
        return config


def _trainer(
    spec: JobSpec,
    run_name: str,
    trials_storage: str,
    callback: UserCallback,
    start_from: str | None = None,
    control: dict | None = None,
    avoid_nodes: Sequence[str] = (),
):
    """One Train run of a trial, as a job's (``build_trainer``), with ``callback`` passing its epochs to Tune.
    Ray Train keeps every checkpoint, as for a job: the control plane's retention deletes what the trial
    does not keep (``orchestrator.loops.trial_retention``), so it never advertises a deleted folder.
    ``control``: how its rank 0 hears of the sweep's preemption (``workers.tune.preemption``)."""
    return build_trainer(
        job_id=run_name,
        attempt=1,
        spec=spec,
        plan=TrainingPlan.fixed(spec),
        storage_path=trials_storage,
        control_plane_url=None,  # a trial's news reaches the control plane through Tune (TrialEventForwarder)
        token="",
        extra_callbacks=[callback],
        start_from=start_from,
        sweep_control=control,
        avoid_nodes=avoid_nodes,
        # A trial's reports are Tune's results (its scheduler's input): made on the loop, as before the writer
        # thread; not yet run through the full suite from that thread (docs/jobs.md "Asynchronous checkpoints").
        background_checkpoints=False,
        epoch_rank_times=True,  # each epoch result carries every rank's own time per step (stragglers)
    )


class TrialReportCallback(TuneReportCallback):
    """Ray Train's ``TuneReportCallback``, for epoch results only: a preemption checkpoint taken mid-epoch (no
    metrics) is the Train run's to resume from, not a result Tune's scheduler or metric could use."""

    def after_report(self, run_context, metrics: list[dict[str, Any]], checkpoint: Checkpoint | None) -> None:
        if is_epoch_result(metrics[0]):
            super().after_report(run_context, metrics, checkpoint)


def _pause_if_preempted(result, control: dict | None, trial_id: str) -> None:
    """A Train run that stopped for the sweep's preemption (``PREEMPTED_KEY``, rank 0's return) pauses the trial
    here, never returning to Tune (``workers.tune.preemption.pause_trial``). One that stopped at the trial's own
    deadline (``DEADLINE_KEY``) fails the trial: ``deadline_exceeded``, its checkpoints kept."""
    returned = getattr(result, "return_value", None)
    if isinstance(returned, dict) and returned.get(DEADLINE_KEY):
        raise TrialDeadlineExceeded(
            f"trial {trial_id} ran past its max_runtime_s: checkpointed at step {returned.get(PREEMPTED_KEY)} and "
            "stopped"
        )
    if control and isinstance(returned, dict) and PREEMPTED_KEY in returned:
        pause_trial(control, trial_id, result.metrics or {})


def run_trial(
    config: dict[str, Any],
    *,
    base: dict,
    trials_storage: str,
    pbt: bool = False,
    control: dict | None = None,
    avoid_nodes: Sequence[str] = (),
) -> None:
    """The function trainable: one trial is one Ray Train run, named after Tune's trial id, so a trial that
    Tune restarts (a new sweep driver) resumes that run's latest checkpoint. PBT trials: ``run_pbt_trial``.
    ``control``: the sweep's preemption (None: the sweep is not preemptible)."""
    spec = trial_spec(JobSpec.model_validate(base), config)
    trial_id = ray.tune.get_context().get_trial_id()
    if control is not None:  # rank 0 looks for this trial in the sweep's stop_trials (its deadline)
        control = {**control, "trial": trial_id}
    if pbt:
        run_pbt_trial(spec, trial_id, trials_storage, control, avoid_nodes)
        return
    trainer = _trainer(spec, trial_id, trials_storage, TrialReportCallback(), control=control, avoid_nodes=avoid_nodes)
    result = trainer.fit()
    _pause_if_preempted(result, control, trial_id)
    # A sweep driver killed after the trial's last epoch but before it passed that epoch on restores this
    # trial, whose Train run has finished and reports nothing more: hand Tune the run's final result once
    # again. When Tune already had it, the control plane merges the repeat (a point per trial and epoch).
    if "epoch" in (result.metrics or {}):
        tune.report(_tune_result(result.metrics, result.checkpoint))


def run_pbt_trial(
    spec: JobSpec, trial_id: str, trials_storage: str, control: dict | None = None, avoid_nodes: Sequence[str] = ()
) -> None:
    """A PBT trial: reports every epoch to Tune with a Tune checkpoint, which PBT may clone into another trial.

    Started with a Tune checkpoint (PBT cloned another trial into this one, or a new sweep driver restored
    the trial), it starts a new Train run (``<trial>-<n>``; its own name would resume its own old run) from
    a copy of that checkpoint: the donor's Tune retention may delete the original before the run reads it.
    """
    run_name, start_from = trial_id, None
    cloned = tune.get_checkpoint()
    if cloned is not None:
        run_name = _next_run_name(trials_storage, trial_id)
        start_from = f"{trials_storage.rstrip('/')}/{run_name}/{START_FOLDER}"
        _copy_folder(cloned, start_from)
        log.info("trial %s: new Train run %s from %s", trial_id, run_name, cloned.path)
    results = Queue(maxsize=1, actor_options={"num_cpus": 0})  # owned by this trial: gone with it
    trainer = _trainer(spec, run_name, trials_storage, CheckpointForwarder(results), start_from, control, avoid_nodes)
    _pause_if_preempted(_fit_and_report(trainer, results), control, trial_id)


class CheckpointForwarder(UserCallback):
    """Runs in the Train controller: hands each epoch's metrics and checkpoint to the trial's thread. The
    queue holds one: the run goes on at the pace Tune takes its results, as with ``TuneReportCallback``."""

    def __init__(self, results: Queue):
        self.results = results

    def after_report(self, run_context, metrics: list[dict[str, Any]], checkpoint: Checkpoint | None) -> None:
        # Every trial report is an epoch checkpoint (SweepSpec checks), but a preemption's taken mid-epoch.
        if checkpoint is not None and is_epoch_result(metrics[0]):
            self.results.put((metrics[0], checkpoint))


def _fit_and_report(trainer, results: Queue):
    """Fit in a thread; report what ``CheckpointForwarder`` hands over to Tune from this (the trial's) thread.
    Returns the Train run's result."""
    errors: list[BaseException] = []
    fitted: list = []

    def fit() -> None:
        try:
            fitted.append(trainer.fit())
        except BaseException as exc:  # raised again in the trial's thread, where Tune sees it
            errors.append(exc)

    runner = threading.Thread(target=fit, name="trial-fit", daemon=True)
    runner.start()
    # fit() returns after the controller's last after_report has put its item: nothing is left behind.
    while runner.is_alive() or not results.empty():
        try:
            metrics, checkpoint = results.get(timeout=1)
        except Empty:
            continue
        # Tune copies the checkpoint into the trial's own folder: the one PBT clones.
        tune.report(
            _tune_result(metrics, checkpoint),
            checkpoint=ray.tune.Checkpoint(checkpoint.path, filesystem=checkpoint.filesystem),
        )
    if errors:
        raise errors[0]
    return fitted[0] if fitted else None


def _tune_result(metrics: dict[str, Any], checkpoint: Checkpoint | None) -> dict[str, Any]:
    """An epoch's metrics as Tune gets them: with the Train checkpoint's path, as ``TuneReportCallback`` does."""
    return {**metrics, CHECKPOINT_PATH_KEY: checkpoint.path} if checkpoint is not None else dict(metrics)


def _next_run_name(trials_storage: str, trial_id: str) -> str:
    """``<trial>-<n>``, n one more than any such run already in storage."""
    fs, root = resolve(trials_storage)
    entries = fs.get_file_info(pyarrow.fs.FileSelector(root.rstrip("/"), allow_not_found=True))
    prefix = f"{trial_id}-"
    taken = [
        int(e.base_name[len(prefix) :])
        for e in entries
        if e.base_name.startswith(prefix) and e.base_name[len(prefix) :].isdigit()
    ]
    return f"{prefix}{max(taken, default=0) + 1}"


def _copy_folder(checkpoint: Checkpoint, destination: str) -> None:
    fs, path = resolve(destination)
    pyarrow.fs.copy_files(checkpoint.path, path, source_filesystem=checkpoint.filesystem, destination_filesystem=fs)


def tune_checkpoint_config(spec: SweepSpec) -> tune.CheckpointConfig | None:
    """Only PBT trials make Tune checkpoints (every epoch): keep a few per trial."""
    if isinstance(spec.scheduler, PbtScheduler):
        return tune.CheckpointConfig(num_to_keep=PBT_TUNE_CHECKPOINTS)
    return None


def trainable(
    spec: SweepSpec,
    storage_path: str,
    sweep_id: str,
    control: dict | None = None,
    avoid_nodes: Sequence[str] = (),
):
    """``avoid_nodes``: the attempt's bad nodes (``SweepAssignment.avoid_nodes``), which no trial's workers use."""
    fn = tune.with_parameters(
        run_trial,
        base=spec.base.model_dump(mode="json"),
        trials_storage=f"{storage_path.rstrip('/')}/{trials_folder(sweep_id)}",
        pbt=isinstance(spec.scheduler, PbtScheduler),
        control=control,
        avoid_nodes=list(avoid_nodes),
    )
    # The trial's own actor only drives its TorchTrainer; the workers hold the real resources (their own
    # placement group, made by Ray Train), so the trial's asks no CPU.
    return tune.with_resources(fn, dict(TRIAL_DRIVER_RESOURCES))


# The sweep driver's reporter, by sweep id. Tune pickles its callbacks into the experiment state (and
# Tuner.restore unpickles them), and a reporter's thread can't be pickled: callbacks look it up here.
REPORTERS: dict[str, EventReporter] = {}


# Not metrics: what Tune adds to a trial's result (its clock, counters, ids), and the epoch and step.
TUNE_KEYS = frozenset(AUTO_RESULT_KEYS) | POSITION_KEYS


def rank_step_s(result: dict[str, Any]) -> list[float] | None:
    """Each rank's own seconds per step over the epoch, as the trial's rank 0 put them in its result
    (``RANK_STEP_S_KEY``); None where there are none, or what is there is not such a list (a user's function may
    report a metric of that name): a bad value must not fail the sweep's callback."""
    times = result.get(RANK_STEP_S_KEY)
    if not isinstance(times, (list, tuple)) or not 2 <= len(times) <= MAX_RANKS:
        return None
    if not all(isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) and t >= 0 for t in times):
        return None
    return [float(t) for t in times]


def run_metrics(result: dict[str, Any]) -> dict[str, float]:
    """The numbers the trial's run reported with an epoch (the loop's and its workload's metrics), without what
    Tune adds (its clock, counters, ids)."""
    return {
        key: float(value)
        for key, value in result.items()
        if key not in TUNE_KEYS and isinstance(value, (int, float)) and not isinstance(value, bool)
    }


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

    def _epochs(self, trial) -> int:
        """The epochs the trial was to run. A callback that raises fails the trial, so a config missing a path
        (seen once, on a restored experiment: CI, trial.config without its "lr.base") falls back to the base's."""
        config = self._config(trial)
        given = {path: value for path, value in config.items() if value is not None}
        if len(given) < len(config):
            log.warning(
                "trial %s: its config lacks %s (it holds %s)",
                trial.trial_id,
                sorted(set(config) - set(given)),
                sorted(trial.config),
            )
        try:
            return trial_spec(self.spec.base, given).epochs
        except ValueError:  # pydantic's ValidationError too
            log.warning(
                "trial %s: its config %s makes no valid job; judged by the base's epochs", trial.trial_id, config
            )
            return self.spec.base.epochs

    def on_trial_start(self, iteration, trials, trial, **info) -> None:
        self.reporter.emit(TrialEvent(trial=trial.trial_id, state="running", config=self._config(trial)))

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        if "epoch" not in result:
            return
        metrics = run_metrics(result)
        self.reporter.emit(
            TrialEvent(
                trial=trial.trial_id,
                state="running",
                config=self._config(trial),
                epoch=int(result["epoch"]),
                step=int(result.get("step", 0)),
                metrics=metrics,
                checkpoint_path=result.get(CHECKPOINT_PATH_KEY),
                rank_step_s=rank_step_s(result),
            )
        )

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        epochs = self._epochs(trial)
        ran = int((trial.last_result or {}).get("epoch", 0))
        state = "succeeded" if ran >= epochs else "stopped"
        message = "" if state == "succeeded" else f"stopped by the scheduler after {ran} of {epochs} epochs"
        self.reporter.emit(TrialEvent(trial=trial.trial_id, state=state, config=self._config(trial), message=message))

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        error = trial_error(trial)
        self.reporter.emit(
            TrialEvent(
                trial=trial.trial_id,
                state="failed",
                config=self._config(trial),
                message=str(error)[-15_000:],
                reason=classify_trial_error(error),
            )
        )


def trial_error(trial) -> BaseException | None:
    """What a failed trial raised. Tune calls ``on_trial_error`` once it wrote the error into the trial's local
    folder, before that folder reaches the run's storage, where ``trial.get_pickled_error()`` and
    ``get_error()`` look (so they found nothing, and every trial failed with no message and no reason)."""
    local = trial.pickled_error_file
    if local and os.path.exists(local):
        try:
            with open(local, "rb") as file:
                return cloudpickle.load(file)
        except Exception:  # an error Tune could pickle but this process cannot load: its text, below
            log.warning("trial %s: its pickled error cannot be loaded", trial.trial_id, exc_info=True)
    if trial.error_file and os.path.exists(trial.error_file):
        with open(trial.error_file) as file:
            return TuneError(file.read())
    return trial.get_pickled_error() or trial.get_error()
