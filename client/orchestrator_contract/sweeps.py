"""The wire contract of a hyperparameter sweep: what ``POST /v1/sweeps`` takes, what the sweep driver
receives and what it reports. Plain pydantic, like ``orchestrator_contract.jobs``: no ray, no torch.

A sweep runs one training job per trial: ``base`` is a job spec, and every key of ``search_space`` is a
dotted path into it (``config.hidden``, ``lr.base``, ``batch.per_worker``...) whose value the search
chooses. Each trial reports once per epoch (its epoch checkpoint), so schedulers count epochs.
"""

from __future__ import annotations

import copy
import math
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, ValidationError, model_validator

from orchestrator_contract import workloads
from orchestrator_contract.base import Strict as _Strict
from orchestrator_contract.jobs import (
    MAX_RUNTIME_S,
    METRIC_DESCRIPTION,
    MODE_DESCRIPTION,
    CheckpointMetric,
    JobSpec,
    StacksEvent,
    StartupEvent,
    StateEvent,
)
from orchestrator_contract.placement import Placement

# What the function trainable (one small actor per running trial, which only drives its TorchTrainer and
# waits on it) asks of Ray: no CPU, and 1 byte of Ray's "memory" resource, which every node has, because Tune
# refuses a request of nothing. It used to ask 0.01 CPU: 2 trials of a 1-CPU worker then needed 2.02 CPUs and
# could not both run on a 2-CPU machine (docs/scheduling.md). Admission counts nothing for it.
TRIAL_DRIVER_RESOURCES = {"CPU": 0.0, "memory": 1.0}
# Parts of the base spec a search may not touch: what identifies the job, and what the sweep itself decides.
# code: every trial runs in the sweep driver's Ray job, whose working_dir and pip are the base job's.
FIXED_PATHS = ("name", "workload", "entrypoint", "labels", "priority", "preemptible", "retries", "checkpoint", "code")
MAX_TRIALS = 10_000
# <storage>/<sweep id>/trials/<run>: each trial's Ray Train runs and their checkpoints. A run is named
# after Tune's trial id, or <trial id>-<n> for the n-th new run of a PBT trial (workers.tune.tuner).
TRIALS_FOLDER = "trials"
# Why a sweep's base (or a searched value) may not say ``failure.on_straggler: restart``.
TRIAL_STRAGGLERS_WARN = (
    "a straggler in a sweep trial only warns (a history row, the trial's stragglers): a trial cannot be restarted "
    'away from its straggler\'s node, which the control plane does not know; leave it out or use "warn"'
)
# The key of a trial's epoch result (what its rank 0 reports to Ray Tune) holding each rank's own seconds per step
# over the epoch, by rank (a list: no metric; ``TrialEvent.rank_step_s``, docs/jobs.md "Stragglers").
RANK_STEP_S_KEY = "rank_step_s"
MAX_RANKS = 1024  # as MetricsEvent.rank_step_s


def trials_folder(sweep_id: str) -> str:
    """A sweep's trial runs, relative to the storage path."""
    return f"{sweep_id}/{TRIALS_FOLDER}"


def is_trial_run(tune_id: str, run_name: str) -> bool:
    """Whether ``run_name`` is one of trial ``tune_id``'s Train runs."""
    suffix = run_name.removeprefix(f"{tune_id}-")
    return run_name == tune_id or (suffix != run_name and suffix.isdigit())


# --- search space --------------------------------------------------------------------------------


class Choice(_Strict):
    """One of ``values``, drawn at random (random, optuna)."""

    type: Literal["choice"]
    values: list[Any] = Field(min_length=1, max_length=1000)

    def candidates(self) -> list[Any]:
        return list(self.values)


class Grid(_Strict):
    """Every one of ``values``, each in its own trial (grid; random repeats the grid num_samples times)."""

    type: Literal["grid"]
    values: list[Any] = Field(min_length=1, max_length=1000)

    def candidates(self) -> list[Any]:
        return list(self.values)


class _Range(_Strict):
    low: float
    high: float

    @model_validator(mode="after")
    def _ordered(self) -> _Range:
        if not self.low < self.high:
            raise ValueError(f"low ({self.low:g}) must be below high ({self.high:g})")
        return self

    def candidates(self) -> list[Any]:
        """The ends of the range: what a trial may get at the extremes."""
        return [self.low, self.high]


class Uniform(_Range):
    type: Literal["uniform"]


class QUniform(_Range):
    """Uniform, rounded to a multiple of ``q`` (Tune's ``quniform``)."""

    type: Literal["quniform"]
    q: float = Field(gt=0)

    def candidates(self) -> list[Any]:
        return [round(self.low / self.q) * self.q, round(self.high / self.q) * self.q]


class LogUniform(_Range):
    """Uniform in log space: for learning rates and other scales."""

    type: Literal["loguniform"]

    @model_validator(mode="after")
    def _positive(self) -> LogUniform:
        if self.low <= 0:
            raise ValueError(f"loguniform needs low > 0 (got {self.low:g}): a log scale has no zero")
        return self


class RandInt(_Strict):
    """An integer in ``[low, high)`` (Tune's ``randint``: high is excluded)."""

    type: Literal["randint"]
    low: int
    high: int

    @model_validator(mode="after")
    def _ordered(self) -> RandInt:
        if not self.low < self.high:
            raise ValueError(f"randint needs low < high (high is excluded); got [{self.low}, {self.high})")
        return self

    def candidates(self) -> list[Any]:
        return [self.low, self.high - 1]


Dimension = Annotated[Choice | Grid | Uniform | QUniform | LogUniform | RandInt, Field(discriminator="type")]


# --- schedulers ----------------------------------------------------------------------------------


class FifoScheduler(_Strict):
    """Every trial runs all its epochs."""

    type: Literal["fifo"]


class AshaScheduler(_Strict):
    """Asynchronous successive halving: at each rung (grace_period x reduction_factor^k epochs) a trial
    continues only if it is in the top 1/reduction_factor of the trials that reached that rung."""

    type: Literal["asha"]
    max_t: int = Field(ge=1, le=100_000, description="Epochs a trial may run at most.")
    grace_period: int = Field(1, ge=1, le=100_000, description="Epochs every trial runs before it can be stopped.")
    reduction_factor: float = Field(3.0, gt=1, le=100)

    @model_validator(mode="after")
    def _grace_within_max(self) -> AshaScheduler:
        if self.grace_period > self.max_t:
            raise ValueError(f"grace_period ({self.grace_period}) must be at most max_t ({self.max_t})")
        return self


# PBT clones a trial's checkpoint into another trial and goes on with a changed config: only values that
# leave every tensor's shape alone may change, so the weights and optimizer state still fit. The
# learning-rate settings do (the loop applies a changed rate after it restores the optimizer);
# config.* (the model), batch.* and scaling.* (the data order, the world size) do not.
PBT_MUTABLE_PREFIX = "lr."


class PbtScheduler(_Strict):
    """Population based training: every ``perturbation_interval`` epochs, a trial in the bottom
    ``quantile_fraction`` of the running trials continues from the checkpoint of one in the top
    quantile, with that trial's config and each ``mutate`` value perturbed (x0.8 or x1.2, or resampled
    from its search-space dimension with ``resample_probability``)."""

    type: Literal["pbt"]
    perturbation_interval: int = Field(ge=1, le=100_000, description="Epochs between two exploit decisions.")
    mutate: list[str] | None = Field(
        None,
        min_length=1,
        max_length=32,
        description="search_space paths PBT perturbs; lr.* only. Default: every lr.* path of the search space.",
    )
    quantile_fraction: float = Field(0.25, gt=0, le=0.5, description="Share of trials that clone / are cloned.")
    resample_probability: float = Field(0.25, ge=0, le=1)


SchedulerSpec = Annotated[FifoScheduler | AshaScheduler | PbtScheduler, Field(discriminator="type")]


# --- the sweep -----------------------------------------------------------------------------------


class SweepSpec(_Strict):
    """What a user submits to ``POST /v1/sweeps``."""

    name: str = Field("", max_length=128)
    base: JobSpec = Field(description="The job every trial runs, before the search fills in its paths.")
    search_space: dict[str, Dimension] = Field(min_length=1, max_length=32)
    algorithm: Literal["random", "grid", "optuna"] = Field(
        "random", description="random (Tune's variant generator, seeded), grid (every combination), optuna (TPE)."
    )
    scheduler: SchedulerSpec = Field(default_factory=lambda: FifoScheduler(type="fifo"))
    metric: CheckpointMetric = Field("val_accuracy", description=METRIC_DESCRIPTION)
    mode: Literal["max", "min"] | None = Field(None, description=MODE_DESCRIPTION)
    num_samples: int | None = Field(
        None,
        ge=1,
        le=MAX_TRIALS,
        description="Trials to sample (random, optuna; default 8). With grid dimensions: repeats of the grid "
        "(default 1).",
    )
    max_concurrent_trials: int = Field(2, ge=1, le=256, description="Trials running at once, never more.")
    seed: int = Field(0, ge=0, le=2**32 - 1, description="Seeds the search: the same seed samples the same configs.")
    priority: int = Field(0, ge=-1000, le=1000)
    preemptible: bool = Field(
        True,
        description="May be preempted as a job may (its running trials checkpoint and pause, the sweep is requeued "
        "and resumes them; finished trials are kept). false (here or in base): as a job's, only a cluster-wide "
        "admin's key or a key of a project that allows it (allow_non_preemptible).",
    )

    placement: Placement | None = Field(
        None,
        description="Which Ray cluster the sweep (every trial) runs on, as a job's placement; null: base's, and "
        "then the scheduler's pick.",
    )

    max_runtime_s: float | None = Field(
        None,
        gt=0,
        le=MAX_RUNTIME_S,
        description="A deadline for the whole sweep: the seconds it may spend RUNNING, summed over its attempts. "
        "Past it the running trials checkpoint and stop, and the sweep ends FAILED with reason deadline_exceeded; "
        "finished trials and every checkpoint are kept. null: no deadline. Each trial's: base.max_runtime_s.",
    )

    @property
    def may_be_preempted(self) -> bool:
        """``preemptible: false`` on the sweep or on its base exempts it."""
        return self.preemptible and self.base.preemptible

    @property
    def run_placement(self) -> Placement | None:
        """Where every trial runs: the sweep's own placement, else its base's (the stored form's twin:
        ``orchestrator.services.runs.placement_of``)."""
        return self.placement or self.base.placement

    @model_validator(mode="after")
    def _check(self) -> SweepSpec:
        if self.mode is None:
            self.mode = workloads.metric_mode(self.base.workload, self.metric)
        grids = [path for path, dim in self.search_space.items() if isinstance(dim, Grid)]
        if self.algorithm == "grid" and len(grids) != len(self.search_space):
            others = sorted(set(self.search_space) - set(grids))
            raise ValueError(f"algorithm grid needs every dimension of type grid; not: {others}")
        if self.algorithm == "optuna" and grids:
            raise ValueError(f"algorithm optuna samples, it cannot walk a grid ({grids}): use algorithm grid or random")
        if self.num_samples is None:
            self.num_samples = 1 if grids else 8
        if self.total_trials > MAX_TRIALS:
            raise ValueError(f"the sweep would run {self.total_trials} trials; at most {MAX_TRIALS}")
        self._check_base()
        for path, dim in self.search_space.items():
            check_path(self.base, path, dim)
        return self

    def _check_base(self) -> None:
        if self.base.failure.on_straggler == "restart":
            raise ValueError(f"base.failure.on_straggler restart: {TRIAL_STRAGGLERS_WARN}")
        checkpoint = self.base.checkpoint
        # One report per epoch is one Tune result: the scheduler's clock and the metric's only source.
        if checkpoint.every_epochs != 1 or checkpoint.every_steps is not None or checkpoint.wait_for_commit:
            raise ValueError(
                "base.checkpoint: a trial checkpoints every epoch and nothing else (every_epochs 1, every_steps "
                "null, wait_for_commit false): each epoch's checkpoint is the result the search compares"
            )
        if isinstance(self.scheduler, AshaScheduler) and "epochs" not in self.search_space:
            if self.scheduler.max_t > self.base.epochs:
                raise ValueError(
                    f"scheduler.max_t ({self.scheduler.max_t}) is more than base.epochs ({self.base.epochs}): "
                    "no trial runs that long"
                )
        if isinstance(self.scheduler, PbtScheduler):
            self._check_pbt(self.scheduler)

    def _check_pbt(self, pbt: PbtScheduler) -> None:
        if self.algorithm == "optuna":
            raise ValueError(
                "scheduler pbt: algorithm optuna cannot be used with it (Ray Tune refuses a search algorithm beside "
                "PBT, which picks the next configs itself): use algorithm random or grid for the first configs"
            )
        if "epochs" in self.search_space:
            raise ValueError(
                "scheduler pbt: epochs cannot be searched with it (a trial that clones another takes its epochs)"
            )
        if pbt.perturbation_interval >= self.base.epochs:
            raise ValueError(
                f"scheduler.perturbation_interval ({pbt.perturbation_interval}) must be below base.epochs "
                f"({self.base.epochs}): no trial would ever be perturbed"
            )
        mutable = [path for path in self.search_space if path.startswith(PBT_MUTABLE_PREFIX)]
        if pbt.mutate is None:
            if not mutable:
                raise ValueError(
                    f"scheduler pbt: the search space has no {PBT_MUTABLE_PREFIX}* path to mutate "
                    f"(paths: {sorted(self.search_space)}); add one, e.g. lr.base"
                )
            pbt.mutate = mutable
        for path in pbt.mutate:
            if not path.startswith(PBT_MUTABLE_PREFIX):
                raise ValueError(
                    f"scheduler.mutate[{path!r}]: only {PBT_MUTABLE_PREFIX}* paths may be mutated: a trial continues "
                    "from another's checkpoint, so the model's shapes, the batch and the workers must stay as they are"
                )
            if path not in self.search_space:
                raise ValueError(
                    f"scheduler.mutate[{path!r}]: not a search_space path (paths: {sorted(self.search_space)}); "
                    "PBT perturbs within the path's search-space dimension"
                )

    @property
    def total_trials(self) -> int:
        """Trials the sweep runs: the grid's size times num_samples (grid, random), or num_samples (optuna)."""
        grid = math.prod(len(d.values) for d in self.search_space.values() if isinstance(d, Grid))
        return grid * (self.num_samples or 1)

    @property
    def concurrency(self) -> int:
        return min(self.max_concurrent_trials, self.total_trials)

    def worst_case_trial(self) -> JobSpec:
        """The base with every ``scaling.*`` dimension at its largest: what one trial may ask of the cluster."""
        overrides = {}
        for path, dim in self.search_space.items():
            if path.startswith("scaling."):
                values = dim.candidates()
                overrides[path] = True if any(v is True for v in values) else max(values, key=_as_number)
        return trial_spec(self.base, overrides)


def _as_number(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) else 0.0


def check_path(base: JobSpec, path: str, dim: Any) -> None:
    """``path`` names a field of the base spec the search may set, and every value it can take there is valid."""
    parts = path.split(".")
    if parts[0] in FIXED_PATHS:
        raise ValueError(f"search_space[{path!r}]: {parts[0]} is fixed for a sweep (fixed: {', '.join(FIXED_PATHS)})")
    node: Any = base.model_dump(mode="json")
    for depth, part in enumerate(parts):
        # A custom workload's (or a training function's) config is free-form: any key under config is its to read.
        free_form = depth == 1 and parts[0] == "config" and _config_model(base.workload or "") is None
        if not isinstance(node, dict) or (part not in node and not free_form):
            known = sorted(node) if isinstance(node, dict) else []
            raise ValueError(f"search_space[{path!r}]: no field {part!r} in the base spec here (fields: {known})")
        node = node.get(part)
    for value in dim.candidates():
        if path == "strategy" and value == "auto":
            raise ValueError(f"search_space[{path!r}]: a trial's strategy is ddp or fsdp; search those, not auto")
        try:
            spec = trial_spec(base, {path: value})
        except ValidationError as exc:
            problem = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            raise ValueError(f"search_space[{path!r}]: value {value!r} makes an invalid job: {problem}") from None
        if spec.failure.on_straggler == "restart":
            raise ValueError(
                f"search_space[{path!r}]: value {value!r} sets failure.on_straggler restart: {TRIAL_STRAGGLERS_WARN}"
            )


def _config_model(workload: str) -> type | None:
    descriptor = workloads.get(workload)
    return None if descriptor is None else descriptor.config_model


def trial_spec(base: JobSpec, config: dict[str, Any]) -> JobSpec:
    """The job one trial runs: the base with each dotted path of ``config`` set to its value."""
    spec = copy.deepcopy(base.model_dump(mode="json"))
    for path, value in config.items():
        *parents, leaf = path.split(".")
        node = spec
        for part in parents:
            node = node[part]
        node[leaf] = value
    return JobSpec.model_validate(spec)


# --- what the sweep driver receives and reports ---------------------------------------------------


class SweepAssignment(BaseModel):
    """``GET /internal/v1/sweeps/{id}/assignment``: everything a sweep driver needs to run one attempt."""

    sweep_id: str
    attempt: int
    spec: SweepSpec
    storage_path: str = Field(description="The sweep's folder is <storage_path>/<sweep_id>.")
    avoid_nodes: list[str] = Field(
        default_factory=list,
        description='Ray node ids no trial\'s workers may be placed on (bad nodes: docs/jobs.md "Bad nodes").',
    )


TrialReportedState = Literal["pending", "running", "succeeded", "stopped", "failed"]


class TrialEvent(_Strict):
    """One trial's news: it exists (with its config), it reported an epoch, or it ended."""

    type: Literal["trial"] = "trial"
    trial: str = Field(min_length=1, max_length=64, description="Ray Tune's trial id.")
    state: TrialReportedState
    config: dict[str, Any] | None = Field(None, description="The searched values, by path.")
    epoch: int | None = Field(None, ge=0)
    step: int | None = Field(None, ge=0)
    metrics: dict[str, float] = Field(default_factory=dict)
    checkpoint_path: str | None = Field(None, max_length=4096)
    rank_step_s: list[Annotated[float, Field(ge=0)]] | None = Field(
        None,
        max_length=MAX_RANKS,
        description="With an epoch: each rank's own seconds per step over the epoch (its data and its forward pass), "
        'by rank, gathered by the trial\'s rank 0 (docs/jobs.md "Stragglers").',
    )
    message: str = Field("", max_length=20_000)
    reason: str = Field(
        "", max_length=64, description="Why a failed trial failed, as a job's reason (code_error, ...)."
    )


SweepEvent = Annotated[StateEvent | TrialEvent | StacksEvent | StartupEvent, Field(discriminator="type")]


class SweepEventBatch(_Strict):
    """``POST /internal/v1/sweeps/{id}/events``; idempotent like a job's."""

    attempt: int = Field(ge=1)
    events: list[SweepEvent] = Field(max_length=1000)
