"""The wire contract between the control plane and the code that runs on the Ray cluster.

Everything here is plain pydantic so that both sides (``orchestrator`` and ``workers``) can import it
without torch or ray. The control plane validates a submitted spec with these models; the driver
receives the same JSON back and parses it with the same models. What the service knows about each
workload (its name, config model, metrics...) is the registry's, ``orchestrator_contract.workloads``; the
built-in config models and the workload helpers are importable from here too.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    StringConstraints,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from orchestrator_contract import workloads
from orchestrator_contract.base import Strict as _Strict
from orchestrator_contract.code import CodeSpec
from orchestrator_contract.metrics import (
    DEFAULT_MAX_METRIC_NAME_CHARS,
    METRIC_NAME_PATTERN,
    check_metric_name,
    compared_metric_problem,
)
from orchestrator_contract.placement import Placement
from orchestrator_contract.workloads import CUSTOM_WORKLOAD_PATTERN as CUSTOM_WORKLOAD_PATTERN
from orchestrator_contract.workloads import DATA_PATH as DATA_PATH
from orchestrator_contract.workloads import LOOP_METRICS
from orchestrator_contract.workloads import DigitsConfig as DigitsConfig
from orchestrator_contract.workloads import TinyGptConfig as TinyGptConfig
from orchestrator_contract.workloads import data_path_fields as data_path_fields
from orchestrator_contract.workloads import is_custom_workload as is_custom_workload

LABEL_KEY = r"^[A-Za-z0-9]([A-Za-z0-9_.\-/]{0,61}[A-Za-z0-9])?$"
LABEL_VALUE = r"^[A-Za-z0-9_.\-]{0,63}$"


# --- job spec --------------------------------------------------------------------------------------


class ScalingSpec(_Strict):
    num_workers: int = Field(2, ge=1, le=1024, description="Training workers (one Ray Train actor each).")
    use_gpu: bool = False
    cpus_per_worker: float = Field(1.0, gt=0, le=512)
    gpus_per_worker: float | None = Field(None, ge=0, le=16, description="Defaults to 1 when use_gpu is set, else 0.")
    memory_per_worker_gb: float | None = Field(
        None,
        gt=0,
        le=10_000,
        description="Memory one worker may use (GPU memory with use_gpu); the "
        "planner behind strategy 'auto' checks the model fits in it. Default: 16 with GPUs, else 4.",
    )

    @model_validator(mode="after")
    def _gpu_defaults(self) -> ScalingSpec:
        if self.gpus_per_worker is None:
            self.gpus_per_worker = 1.0 if self.use_gpu else 0.0
        elif self.gpus_per_worker > 0 and not self.use_gpu:
            raise ValueError("gpus_per_worker > 0 needs use_gpu: true")
        elif self.use_gpu and self.gpus_per_worker == 0:
            raise ValueError("use_gpu: true needs gpus_per_worker > 0")
        if self.memory_per_worker_gb is None:
            self.memory_per_worker_gb = 16.0 if self.use_gpu else 4.0
        return self

    def total_resources(self) -> dict[str, float]:
        """What the whole worker group asks of the cluster, all at once."""
        return {
            "CPU": self.num_workers * self.cpus_per_worker,
            "GPU": self.num_workers * (self.gpus_per_worker or 0.0),
        }


class BatchSpec(_Strict):
    per_worker: int = Field(32, ge=1, le=65_536, description="Micro-batch size on each worker.")
    accumulation_steps: int = Field(
        1, ge=1, le=1024, description="Micro-batches per optimizer step (gradients all-reduced once, on the last)."
    )


LrScaling = Literal["linear", "sqrt", "none"]


class LrSpec(_Strict):
    base: float = Field(0.05, gt=0, le=10, description="Learning rate tuned for base_batch.")
    base_batch: int = Field(64, ge=1, description="The global batch `base` was tuned for.")
    scaling: LrScaling = Field("linear", description="How the rate follows the global batch.")
    warmup_steps: int = Field(0, ge=0, le=1_000_000, description="Optimizer steps of linear warmup from 0.")


class OptimizerSpec(_Strict):
    name: Literal["sgd", "adam", "adamw"] = "sgd"
    momentum: float = Field(0.9, ge=0, lt=1, description="SGD only.")
    weight_decay: float = Field(0.0, ge=0, le=1)


# The metrics the training loop reports with every checkpoint taken at an epoch's end (val_accuracy: unless
# the workload brings metrics of its own; a mid-epoch checkpoint carries none), and which way is better.
CHECKPOINT_METRICS: Mapping[str, Literal["max", "min"]] = LOOP_METRICS
# What the loop reports itself with every epoch checkpoint, whatever the workload; beside them, the workload's
# validation metrics (val_accuracy, unless it has its own). tests/unit/test_workload_metrics.py holds this to the
# loop's real output.
LOOP_EPOCH_METRICS = frozenset({"train_loss", "val_loss", "samples_per_s"})
# A metric a spec names: one of CHECKPOINT_METRICS, or any a workload reports (Workload.metrics). Whether the
# run will ever report it is a check at submit (``metric_never_reported``), not of the model: a stored spec is
# read back with the model, and a rule added later must not make an old row unreadable.
CheckpointMetric = Annotated[
    str,
    AfterValidator(check_metric_name),
    WithJsonSchema({"type": "string", "pattern": METRIC_NAME_PATTERN, "maxLength": DEFAULT_MAX_METRIC_NAME_CHARS}),
]


def epoch_metrics(workload: str | None) -> frozenset[str] | None:
    """The metrics every epoch checkpoint of ``workload`` carries, known before it runs: the loop's own and
    those its registered descriptor declares. None where only the run knows them: a training function (its
    ``ctx.report`` calls) and an unregistered ``"package.module:function"`` workload (its code may bring a
    ``Workload.metrics`` or a descriptor of its own, which the control plane never imports)."""
    descriptor = workloads.get(workload) if workload else None
    return None if descriptor is None else LOOP_EPOCH_METRICS | frozenset(descriptor.metrics)


def metric_never_reported(workload: str | None, metric: str, max_chars: int) -> str | None:
    """Why a run of ``workload`` would never report ``metric`` (a ``keep_best`` that would keep nothing, a sweep
    that Ray Tune would fail at its first result), or None. Checked when a job or sweep is submitted
    (``orchestrator.services.submission``), never when a stored spec is read back. A metric known only when
    the run reports it (``epoch_metrics`` is None) passes unless it is a position or too long."""
    problem = compared_metric_problem(metric, max_chars)
    if problem:
        return problem
    names = epoch_metrics(workload)
    if names is not None and metric not in names:
        return f"workload {workload!r} never reports {metric!r}: its epoch checkpoints carry {sorted(names)}"
    return None


METRIC_DESCRIPTION = (
    "A metric the epoch checkpoints carry: the loop's (val_loss, train_loss, samples_per_s; val_accuracy unless "
    "the workload has metrics of its own) or one the workload reports (val_mae...)."
)
MODE_DESCRIPTION = (
    "max: higher is better; min: lower is. Default: max for val_accuracy and samples_per_s, min for the losses, "
    "the workload's own for a metric its registered descriptor declares; required for any other metric."
)


class KeepBestSpec(_Strict):
    metric: CheckpointMetric = Field(description=METRIC_DESCRIPTION)
    mode: Literal["max", "min"] | None = Field(None, description=MODE_DESCRIPTION)
    count: int = Field(1, ge=1, le=1000, description="How many of the best checkpoints to keep.")

    @model_validator(mode="after")
    def _default_mode(self) -> KeepBestSpec:
        if self.mode is None:  # any other metric: the job's workload may know (JobSpec._keep_best_mode)
            self.mode = CHECKPOINT_METRICS.get(self.metric)
        return self


class CheckpointSpec(_Strict):
    # "async" is a Python keyword: the field is async_, its name in JSON (in and out) "async".
    model_config = ConfigDict(extra="forbid", serialize_by_alias=True)

    every_epochs: int | None = Field(1, ge=1, le=10_000, description="Checkpoint every N epochs.")
    every_steps: int | None = Field(None, ge=1, description="Checkpoint every N optimizer steps.")
    keep: int = Field(
        2, ge=1, le=1000, description="Most recent checkpoints kept (the latest is never deleted), plus keep_best's."
    )
    keep_best: KeepBestSpec | None = Field(
        None, description="Also keep the best `count` checkpoints by `metric` (ones without the metric don't count)."
    )
    export_full: bool = Field(
        False,
        description="Deprecated, no effect: every FSDP checkpoint now also holds the full (unsharded) model "
        "state dict that serving loads. Still accepted, so specs that set it keep validating.",
    )
    wait_for_commit: bool = Field(
        False,
        description="Train on only once Ray Train has registered the checkpoint. Off: training goes on while the "
        "controller registers it (up to ORCHESTRATOR_TRAIN_POLL_INTERVAL_S later), so a failure in that window "
        "repeats up to two checkpoint intervals. On: at most one, for up to one poll interval of waiting per "
        "checkpoint.",
    )
    async_: bool = Field(
        True,
        alias="async",
        description="Upload checkpoints in the background: training goes on once every rank has written its "
        "part to local disk, while Ray Train copies it to storage and registers it (one upload at a time; the "
        "next checkpoint waits for the one before). A crash meanwhile resumes from the checkpoint before. The "
        "run's last checkpoint, a preemption's and a deadline's are written synchronously. false: every "
        "checkpoint blocks training until it is registered in storage.",
    )


class RetrySpec(_Strict):
    max_worker_restarts: int = Field(
        2,
        ge=0,
        le=100,
        description="Worker-group restarts within one attempt, for infrastructure failures (a worker or its "
        "node died).",
    )
    max_attempts: int = Field(
        3, ge=1, le=100, description="Driver attempts the control plane may make (the driver or the Ray head died)."
    )
    retry_app_errors: bool = Field(
        False,
        description="Also restart the worker group after an exception in the training code (counted in "
        "max_worker_restarts). Off: such a job fails at once with the traceback. Out-of-memory is never retried.",
    )


# The longest deadline a run may set (a year): past that, "no deadline" (null) says what is meant.
MAX_RUNTIME_S = 366 * 24 * 3600


class FailureSpec(_Strict):
    """Failures that do not crash anything (docs/jobs.md "Hangs" and "Stragglers")."""

    hang_timeout_s: Annotated[float, Strict()] | Literal["auto"] | None = Field(
        "auto",
        description="A job whose reported progress (its metrics' steps, its checkpoints) has not advanced for this "
        "many seconds of RUNNING is hung: every rank's Python stack is taken (the attempt's log, the job's events) "
        "and the attempt ends with reason hung, then resumes from the latest checkpoint while retries.max_attempts "
        'last. "auto": max(ORCHESTRATOR_HANG_TIMEOUT_FLOOR_S, 20x the median time between its reports, 2x the '
        "longest it took so far); null: never.",
    )

    @field_validator("hang_timeout_s")
    @classmethod
    def _positive(cls, value: float | str | None) -> float | str | None:
        if isinstance(value, float) and not 0 < value <= MAX_RUNTIME_S:
            raise ValueError(
                f'hang_timeout_s {value:g}: give seconds in (0, {MAX_RUNTIME_S}], "auto" (the default) or null (off)'
            )
        return value

    straggler_factor: float = Field(
        1.5,
        gt=1,
        le=100,
        description="A rank whose own time per step (its data and its forward pass, before the backward pass makes "
        "every rank wait for the slowest) is more than this many times the other ranks' median for "
        "ORCHESTRATOR_STRAGGLER_WINDOWS metric windows in a row is a straggler: a history row and the job's "
        "stragglers. More than 1.",
    )
    on_straggler: Literal["warn", "restart"] = Field(
        "warn",
        description='What a straggler does to the run: "warn" (a history row, the job\'s stragglers, the job page); '
        '"restart" also checkpoints now and stops the attempt, and places the next one without the straggler\'s '
        "node (counted against retries.max_attempts; with none left, it warns only).",
    )


LabelKey = Annotated[str, StringConstraints(pattern=LABEL_KEY)]
LabelValue = Annotated[str, StringConstraints(pattern=LABEL_VALUE)]


class JobSpec(_Strict):
    """What a user submits to ``POST /v1/jobs``. Only ``workload`` (or ``entrypoint``) is required."""

    name: str = Field("", max_length=128, description="Free-form display name.")
    workload: str | None = Field(
        None,
        description='What the platform\'s loop trains: a built-in workload ("digits", "tiny_gpt"), '
        '"package.module:function" from an allowed package, or "module:function" from the job\'s own code '
        "(`code`). Give this or `entrypoint`.",
    )
    entrypoint: str | None = Field(
        None,
        max_length=256,
        description='A training function that owns its loop, "module:function" (`main(ctx)`), from the job\'s '
        "own code (`code`) or an allowed package. Give this or `workload`.",
    )
    config: dict[str, Any] = Field(
        default_factory=dict, validate_default=True, description="The workload's own parameters (model, data)."
    )
    scaling: ScalingSpec = Field(default_factory=ScalingSpec)
    epochs: int = Field(12, ge=1, le=100_000, description="Passes over the training set.")
    batch: BatchSpec = Field(default_factory=BatchSpec)
    lr: LrSpec = Field(default_factory=LrSpec)
    optimizer: OptimizerSpec = Field(default_factory=OptimizerSpec)
    strategy: Literal["ddp", "fsdp", "auto"] = Field("ddp", description="auto: the planner picks and says why.")
    precision: Literal["fp32", "bf16", "fp16"] = Field("fp32", description="fp16 needs GPUs (it uses a grad scaler).")
    sync_batchnorm: bool = Field(False, description="Synchronise BatchNorm statistics across workers.")
    grad_clip_norm: float | None = Field(None, gt=0, description="Clip the global gradient norm to this.")
    seed: int = Field(0, ge=0, le=2**32 - 1, description="Seeds the split, the init, the sampler and dropout.")
    metrics_every_steps: int = Field(10, ge=1, description="Stream step metrics every N optimizer steps.")
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    retries: RetrySpec = Field(default_factory=RetrySpec)
    failure: FailureSpec = Field(default_factory=FailureSpec)
    priority: int = Field(0, ge=-1000, le=1000, description="Higher runs first; ties go oldest first.")
    preemptible: bool = Field(
        True,
        description="May be preempted (checkpointed, stopped and requeued) for a run of higher priority or a "
        "project under its fair share or quota. false: only a cluster-wide admin's key, or any key of a project "
        "that allows it (allow_non_preemptible).",
    )
    max_runtime_s: float | None = Field(
        None,
        gt=0,
        le=MAX_RUNTIME_S,
        description="A deadline: the seconds the job may spend RUNNING, summed over its attempts (time queued, "
        "starting or restarting is not counted). Past it the job checkpoints, stops and ends FAILED with reason "
        "deadline_exceeded; its checkpoints are kept. null: no deadline. In a sweep's base: each trial's (the time "
        "it ran while its sweep was RUNNING).",
    )
    labels: dict[LabelKey, LabelValue] = Field(default_factory=dict, max_length=32)
    code: CodeSpec | None = Field(
        None,
        description="The job's own code, uploaded with POST /v1/code: its working directory on the cluster, "
        "where `workload` may come from.",
    )
    placement: Placement | None = Field(
        None,
        description="Which Ray cluster it runs on: {cluster: name} or {labels: {...}}, among its project's "
        "(docs/clusters.md). null: the scheduler picks one where it fits. In a sweep's base: the sweep's, unless "
        "the sweep sets its own.",
    )

    @field_validator("workload")
    @classmethod
    def _known_workload(cls, workload: str | None) -> str | None:
        if workload is None or workloads.is_known(workload):
            return workload
        raise ValueError(f'unknown workload {workload!r}: use one of {workloads.names()} or "package.module:function"')

    @field_validator("entrypoint")
    @classmethod
    def _function_name(cls, entrypoint: str | None) -> str | None:
        if entrypoint is None or is_custom_workload(entrypoint):
            return entrypoint
        raise ValueError(f'entrypoint {entrypoint[:80]!r}: expected "module:function" (e.g. "train:main")')

    @field_validator("config")
    @classmethod
    def _validate_builtin_config(cls, config: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        # Fill in and check a built-in workload's parameters (errors keep their config.* location),
        # so that the stored spec is the complete one the job really runs with.
        descriptor = workloads.get(info.data.get("workload") or "")
        return config if descriptor is None else descriptor.validate_config(config)

    @field_validator("checkpoint")
    @classmethod
    def _keep_best_metric(cls, checkpoint: CheckpointSpec, info: ValidationInfo) -> CheckpointSpec:
        keep_best = checkpoint.keep_best
        if keep_best is None or "workload" not in info.data:  # no keep_best, or a workload already refused
            return checkpoint
        if keep_best.mode is None:
            keep_best.mode = workloads.metric_mode(info.data["workload"], keep_best.metric)
        return checkpoint

    @model_validator(mode="after")
    def _workload_or_entrypoint(self) -> JobSpec:
        if (self.workload is None) == (self.entrypoint is None):
            given = "both" if self.workload is not None else "neither"
            raise ValueError(
                f"give exactly one of workload (the platform's training loop trains it) and entrypoint (your own "
                f'training function, "module:function"), not {given}'
            )
        return self

    @model_validator(mode="after")
    def _precision_needs_hardware(self) -> JobSpec:
        if self.precision == "fp16" and not self.scaling.use_gpu:
            raise ValueError("precision fp16 needs GPUs (scaling.use_gpu: true); on CPU use bf16 or fp32")
        return self

    @property
    def runs(self) -> str:
        """What the job runs, as stored and listed: its workload, or its training function's entrypoint."""
        return self.workload or self.entrypoint or ""

    @property
    def global_batch(self) -> int:
        """Samples per optimizer step over the whole group."""
        return self.batch.per_worker * self.scaling.num_workers * self.batch.accumulation_steps

    @property
    def scaled_lr(self) -> float:
        return scale_lr(self.lr.base, self.lr.base_batch, self.global_batch, self.lr.scaling)


def scale_lr(base_lr: float, base_batch: int, global_batch: int, rule: LrScaling) -> float:
    """The learning rate for ``global_batch`` given one tuned for ``base_batch``."""
    ratio = global_batch / base_batch
    return base_lr * {"linear": ratio, "sqrt": ratio**0.5, "none": 1.0}[rule]


# --- what the driver receives -----------------------------------------------------------------------


class TrainingPlan(BaseModel):
    """What the control plane decided for a job before it ran, recorded on the job."""

    strategy: Literal["ddp", "fsdp"] = Field(description="The strategy that runs (auto resolved).")
    reason: str = Field("", description="Why, when the planner chose.")
    global_batch: int
    lr: float = Field(description="The learning rate after scaling to the global batch.")

    @classmethod
    def fixed(cls, spec: JobSpec) -> TrainingPlan:
        """The plan of a spec whose strategy is given (not ``auto``): nothing to decide."""
        assert spec.strategy != "auto", "the planner resolves auto"
        return cls(strategy=spec.strategy, reason="", global_batch=spec.global_batch, lr=spec.scaled_lr)


class DriverExit(enum.IntEnum):
    """Exit status of ``workers.train.driver``. The reconciler reads it when the driver's own report of the
    outcome never reached the control plane; any other status (a kill, a crash) means the driver was lost."""

    SUCCEEDED = 0
    MISCONFIGURED = 2  # no control plane URL or token: another attempt would fail the same way
    TRAINING_FAILED = 3  # failed for good (an app error, out of memory, worker restarts spent)
    CLUSTER_FAILED = 4  # the Ray cluster failed under the driver (head lost): worth another attempt
    PREEMPTED = 5  # checkpointed and stopped because the control plane preempted it: requeued, not failed


class DriverAssignment(BaseModel):
    """``GET /internal/v1/jobs/{id}/assignment``: everything a driver needs to run one attempt."""

    job_id: str
    attempt: int
    spec: JobSpec
    plan: TrainingPlan
    storage_path: str = Field(description="Ray Train storage_path; the run's folder is <storage_path>/<job_id>.")
    avoid_nodes: list[str] = Field(
        default_factory=list,
        description='Ray node ids the attempt\'s workers must not be placed on (bad nodes: docs/jobs.md "Bad nodes").',
    )


class ControlSignal(BaseModel):
    """``GET /internal/v1/jobs/{id}/control?attempt=N`` (a sweep's: ``/internal/v1/sweeps/{id}/control``): what
    the control plane asks of a running attempt. Polled by rank 0 (a sweep's: its driver and each running
    trial's rank 0; ``workers.runtime.control``); unknown fields are ignored, so it can grow."""

    checkpoint_now: bool = Field(
        False, description="Preempted: write a checkpoint at the next step, outside the schedule, and stop."
    )
    stacks_wanted: str | None = Field(
        None,
        description='Suspected hung (docs/jobs.md "Hangs"): every rank sends its Python stack once per value '
        "(a StacksEvent). Polled by every rank of a job.",
    )
    stop_trials: list[str] = Field(
        default_factory=list,
        description="A sweep's: the Ray Tune ids of its trials past their deadline (base.max_runtime_s; docs/jobs.md "
        '"Deadlines"): each checkpoints at its next step, stops and ends FAILED deadline_exceeded.',
    )
    trial_stacks_wanted: dict[str, str] = Field(
        default_factory=dict,
        description='A sweep\'s: its trials suspected hung (docs/jobs.md "Hangs"), by Ray Tune id: every rank of such a '
        "trial sends its Python stack once per value (a StacksEvent with its trial). Polled by every rank of a trial.",
    )
    end_workers: list[str] = Field(
        default_factory=list,
        description="A sweep's: the workers (StacksEvent.worker) of a trial found hung: each ends its process, and Ray "
        "Train restarts the trial's workers from its latest checkpoint (retries.max_worker_restarts).",
    )


# --- events the cluster reports back ----------------------------------------------------------------


class StateEvent(_Strict):
    type: Literal["state"] = "state"
    state: Literal["running", "restarting", "succeeded", "failed"]
    reason: str = Field("", max_length=64)
    message: str = Field("", max_length=20_000)
    result: dict[str, Any] | None = None
    rank_nodes: list[Annotated[str, Field(max_length=128)]] | None = Field(
        None,
        max_length=1024,
        description="With ``running``: each rank's Ray node id, by rank (which node a straggler or a hung rank is "
        'on: docs/jobs.md "Bad nodes"); null where there is no Ray.',
    )


class MetricsEvent(_Strict):
    type: Literal["metrics"] = "metrics"
    epoch: int = Field(ge=0)
    step: int = Field(ge=0)
    values: dict[str, float]
    rank_step_s: list[Annotated[float, Field(ge=0)]] | None = Field(
        None,
        max_length=1024,
        description="Each rank's own seconds per step over the window ending here (its data and its forward pass), "
        'by rank, gathered by rank 0 (docs/jobs.md "Stragglers").',
    )
    checkpoint_blocked_s: float | None = Field(
        None,
        ge=0,
        le=1e7,
        description="Seconds training was blocked by checkpoints since the previous metric point (rank 0's clock; "
        'docs/jobs.md "Goodput").',
    )


class CheckpointEvent(_Strict):
    type: Literal["checkpoint"] = "checkpoint"
    epoch: int = Field(ge=0)
    step: int = Field(ge=0)
    path: str = Field(min_length=1, max_length=4096)
    size_bytes: int = Field(ge=0)
    metrics: dict[str, float] = Field(default_factory=dict)


class StacksEvent(_Strict):
    """One rank's answer to ``ControlSignal.stacks_wanted``: its threads' Python stacks, and where its main thread
    was (``workers.runtime.stacks``)."""

    type: Literal["stacks"] = "stacks"
    request: str = Field(min_length=1, max_length=64, description="The stacks_wanted value it answers.")
    rank: int = Field(ge=0, le=100_000)
    node: str = Field("", max_length=256)
    pid: int = Field(0, ge=0)
    in_collective: bool = Field(description="The main thread was in torch.distributed or a backward pass.")
    where: str = Field("", max_length=500, description="The main thread's innermost frame outside torch.")
    stacks: str = Field("", max_length=64_000)
    trial: str | None = Field(None, min_length=1, max_length=64, description="A sweep trial's rank: its Ray Tune id.")
    worker: str = Field(
        "", max_length=64, description="This worker process's own id, named in ControlSignal.end_workers to end it."
    )


# The stages of an attempt's start, in order (docs/jobs.md "Start-up timeline"): the control plane records the first
# four itself (the attempt began, Ray took its submission, its driver claimed its token, fetched its assignment), the
# run reports the rest with a StartupEvent (its driver before Ray Train starts, Ray Train's controller once the
# worker group and its process group are up, rank 0 as its training function begins, its data is loaded, its first
# step is done).
CONTROL_PLANE_STAGES = ("admitted", "submitted", "driver_started", "assignment_fetched")
RUN_STAGES = ("trainer_started", "workers_up", "training_started", "data_ready", "first_step")
STARTUP_STAGES = CONTROL_PLANE_STAGES + RUN_STAGES
TRIAL_STAGES = ("trial_started", "first_result")  # a sweep trial's: the control plane sees them arrive
RunStage = Literal["trainer_started", "workers_up", "training_started", "data_ready", "first_step"]


class StartupEvent(_Strict):
    """A stage of the attempt's start reached (``RUN_STAGES``), timed by its arrival: the control plane's clock."""

    type: Literal["startup"] = "startup"
    stage: RunStage


Event = Annotated[StateEvent | MetricsEvent | CheckpointEvent | StacksEvent | StartupEvent, Field(discriminator="type")]


class EventBatch(_Strict):
    """``POST /internal/v1/jobs/{id}/events``. Events are idempotent: a retried batch changes nothing."""

    attempt: int = Field(ge=1)
    events: list[Event] = Field(max_length=1000)
