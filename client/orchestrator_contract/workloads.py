"""The workload registry: one descriptor per workload, and the one place every part of the service asks.

A *workload* is what a job trains: its model, its data and the shape of its samples. Everything about
how it is trained (sharding, DDP or FSDP, precision, accumulation, checkpoints, resuming) belongs to the
shared training loop (``workers.runtime.train_loop``), the same for every workload.

What a ``WorkloadDescriptor`` holds
-----------------------------------

- ``name``: what a job spec's ``workload`` says (``"digits"``), or ``"package.module:function"``.
- ``config_model``: the plain pydantic model (a ``WorkloadConfig``) that validates and completes the
  job's ``config``; ``None`` leaves the config free-form (the workload checks it itself). Fields marked
  with ``json_schema_extra={DATA_PATH: True}`` name a data file: the control plane checks at submit that
  it resolves inside a data root the operator configured.
- ``build``: ``build(config: dict, seed: int) -> Workload`` (``workers.workloads.base``): the model, the
  datasets, the loss.
- ``build_model``: ``build_model(config: dict) -> nn.Module``, the untrained model without loading any
  data (checkpoint loading and serving); ``None``: ``build(config, 0).model``.
- ``predictor``: the class that serves the model (``workers.serve.app``: checks a request body, predicts
  a batch, probes for health), called ``predictor(model, config)``; ``None``: rows of numbers as wide as
  the training samples (``TensorPredictor``).
- ``metrics``: the metrics its epoch checkpoints carry, each ``"max"`` (higher is better) or ``"min"``;
  by default the loop's (``LOOP_METRICS``); a workload with its own (``Workload.metrics``) declares them
  here so that a spec naming one may leave out its ``mode`` (``metric_mode``). ``selection_metric``: the
  one a deployment's ``select: best`` picks its checkpoint by.
- ``servable``: whether a deployment may serve it. ``example_request``: a request body its predictor takes (the
  dashboard's "try it" form starts from it; ``None``: the form starts empty).
- ``param_count``: a planner hint, ``param_count(validated_config) -> int``; with it, ``strategy: auto``
  checks the model fits the workers' memory before the job runs (``orchestrator.planner``).
- ``description``: one line for people.

``build``, ``build_model`` and ``predictor`` are given as ``"package.module:attribute"`` strings (or as
callables) and resolved on first use, on the cluster: this module and the descriptors import neither
torch nor ray. It is part of the wire contract (``orchestrator_contract``) because the control plane imports
nothing else from ``workers/`` (the import contracts in ``pyproject.toml``); the code that loads a
workload on the cluster is ``workers.workloads`` (``load_workload``, ``load_model_builder``).

Who asks
--------

``JobSpec`` (known names, the config filled in), the control plane's submit checks (data paths), the
planner (parameter counts), deployments (servable, the checkpoint to pick), the training loop
(``workers.workloads.load_workload``), checkpoint loading (``load_model_builder``) and Serve
(``workers.serve.app.make_predictor``). None of them keeps a table of its own.

How to add a workload
---------------------

A built-in one, in two steps and no other file:

1. ``workers/workloads/<name>.py`` (torch is fine there): ``build(config, seed) -> Workload``,
   ``build_model(config) -> nn.Module`` and, if rows of numbers don't fit it, its predictor (built on
   ``workers.serve.predictors``: check a body, predict a batch, probe).
2. At the end of this module (no torch here): its config model, a subclass of ``WorkloadConfig`` (give
   it a ``param_count`` method for the planner), and one
   ``register(WorkloadDescriptor(name=..., config_model=..., build="workers.workloads.<name>:build",
   predictor="workers.workloads.<name>:<Predictor>", example_request={...}, ...))``. Serving and the
   dashboard read the descriptor; nothing else changes.

The descriptor stays here, apart from its code, because the control plane and the SDK validate a job's
``workload`` and ``config`` against it without torch and without ``workers/`` (the import contracts).

Code that is not part of the service (an installed package today; uploaded code, later) is named by
``"package.module:function"`` (the control plane checks the package is allowed, and imports nothing of it).
On the cluster ``resolve`` imports it: a function is taken as ``build`` (config free-form, served as rows,
chosen by ``val_accuracy``), and an attribute that is itself a ``WorkloadDescriptor`` brings its own
``build_model``, ``predictor`` and metrics. Such code may also call ``register(...)`` when it is imported.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from orchestrator_contract.base import Strict
from orchestrator_contract.metrics import check_metric_name

# A custom workload names a function inside an installed package: "package.module:function".
CUSTOM_WORKLOAD_PATTERN = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*$")
# A registered workload's name: short, lower case, never mistaken for "package.module:function".
NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_]{0,63}$")

# Marks a workload config field that names a file the workers open: the control plane checks, at submit,
# that it resolves inside a data root (orchestrator/data_paths.py).
DATA_PATH = "x-data-path"

# The metrics the training loop reports for every workload (every checkpoint taken at an epoch's end
# carries them; a mid-epoch checkpoint carries none), and which way is better for each.
LOOP_METRICS: Mapping[str, Literal["max", "min"]] = MappingProxyType(
    {"val_accuracy": "max", "val_loss": "min", "train_loss": "min", "samples_per_s": "max"}
)
DEFAULT_SELECTION_METRIC = "val_accuracy"


class WorkloadConfig(Strict):
    """Base of a workload's config model (unknown keys are an error). A config holds only what shapes the
    model and the data; how it is trained (epochs, batch, learning rate, optimizer, precision, strategy)
    is the job spec's, the same for every workload."""


def data_path_fields(config_model: type[BaseModel]) -> list[str]:
    """The names of a config model's fields that name a data file."""
    return [
        name
        for name, field_info in config_model.model_fields.items()
        if isinstance(field_info.json_schema_extra, dict) and field_info.json_schema_extra.get(DATA_PATH)
    ]


def is_custom_workload(workload: str) -> bool:
    return bool(CUSTOM_WORKLOAD_PATTERN.match(workload))


Ref = str | Callable[..., Any]  # "package.module:attribute", or the object itself


@dataclass(frozen=True)
class WorkloadDescriptor:
    """Everything the service knows about one workload (see the module docstring for each field)."""

    name: str
    build: Ref
    config_model: type[BaseModel] | None = None
    build_model: Ref | None = None
    predictor: Ref | None = None
    metrics: Mapping[str, Literal["max", "min"]] = field(default_factory=lambda: LOOP_METRICS)
    selection_metric: str = DEFAULT_SELECTION_METRIC
    servable: bool = True
    example_request: Mapping[str, Any] | None = None
    param_count: Callable[[Any], int] | None = None
    description: str = ""

    def __post_init__(self) -> None:
        if self.selection_metric not in self.metrics:
            raise ValueError(
                f"workload {self.name!r}: selection_metric {self.selection_metric!r} is not one of its "
                f"metrics {sorted(self.metrics)}"
            )
        bad = {metric: mode for metric, mode in self.metrics.items() if mode not in ("max", "min")}
        if bad:
            raise ValueError(f"workload {self.name!r}: a metric's mode is 'max' or 'min', not {bad}")
        for metric in self.metrics:
            check_metric_name(metric)

    @property
    def selection(self) -> tuple[str, bool]:
        """The metric a deployment picks the best checkpoint by, and whether higher is better."""
        return self.selection_metric, self.metrics[self.selection_metric] == "max"

    @property
    def data_path_fields(self) -> list[str]:
        return data_path_fields(self.config_model) if self.config_model is not None else []

    def validate_config(self, config: dict[str, Any]) -> dict[str, Any]:
        """The config completed with its defaults (raises pydantic's ValidationError); free-form as given."""
        if self.config_model is None:
            return config
        return self.config_model.model_validate(config).model_dump()

    def count_params(self, config: dict[str, Any]) -> int | None:
        """The planner hint: the model's parameter count for ``config``, or None when unknown before it runs."""
        if self.config_model is None or self.param_count is None:
            return None
        return int(self.param_count(self.config_model.model_validate(config)))

    # --- resolved on first use, on the cluster (these import the workload's code: torch) ---

    def load_build(self) -> Callable[[dict, int], Any]:
        return _resolve(self.build, self.name, "function")

    def load_model_builder(self) -> Callable[[dict], Any]:
        if self.build_model is None:
            build = self.load_build()
            return lambda config: build(config, 0).model
        return _resolve(self.build_model, self.name, "function")

    def load_predictor(self) -> type | None:
        """The predictor class, or None for the rows-of-numbers one."""
        return None if self.predictor is None else _resolve(self.predictor, self.name, "predictor")


_REGISTRY: dict[str, WorkloadDescriptor] = {}


def register(descriptor: WorkloadDescriptor, *, replace: bool = False) -> WorkloadDescriptor:
    """Make ``descriptor`` known to every part of the process under its name; returns it."""
    if not NAME_PATTERN.match(descriptor.name):
        raise ValueError(
            f"workload name {descriptor.name!r}: 1 to 64 of a-z, 0-9 and _, starting with a letter "
            '("package.module:function" names need no registering)'
        )
    if descriptor.name in _REGISTRY and not replace and _REGISTRY[descriptor.name] != descriptor:
        raise ValueError(f"workload {descriptor.name!r} is already registered")
    _REGISTRY[descriptor.name] = descriptor
    return descriptor


def unregister(name: str) -> None:
    """Forget a registered workload (tests; a reloaded code package)."""
    _REGISTRY.pop(name, None)


def get(name: str) -> WorkloadDescriptor | None:
    """The registered workload of that name (no import happens), or None."""
    return _REGISTRY.get(name)


def names() -> list[str]:
    """The registered workloads' names, sorted."""
    return sorted(_REGISTRY)


def registered() -> dict[str, WorkloadDescriptor]:
    return dict(_REGISTRY)


def is_known(name: str) -> bool:
    """A registered name or a well-formed ``"package.module:function"``: what a job spec accepts."""
    return name in _REGISTRY or is_custom_workload(name)


def describe(name: str) -> WorkloadDescriptor | None:
    """The descriptor as the control plane sees it, importing nothing: a registered one, the generic one of a
    ``"package.module:function"`` name (free-form config, rows predictor, the loop's metrics), or None."""
    descriptor = _REGISTRY.get(name)
    if descriptor is None and is_custom_workload(name):
        descriptor = WorkloadDescriptor(name=name, build=name, description="custom workload")
    return descriptor


def metric_mode(name: str | None, metric: str) -> Literal["max", "min"]:
    """Which way ``metric`` is better where a spec leaves ``mode`` out: the loop's metrics' (``LOOP_METRICS``, as
    always), then what workload ``name``'s descriptor declares. Any other metric: ValueError, the spec must say."""
    mode = LOOP_METRICS.get(metric)
    descriptor = describe(name) if name else None  # None: a training function's job, no descriptor
    if mode is None and descriptor is not None:
        mode = descriptor.metrics.get(metric)
    if mode is None:
        raise ValueError(f"mode is required for metric {metric!r} (max or min)")
    return mode


def servable_names() -> list[str]:
    """The registered workloads a deployment may serve (any ``"package.module:function"`` one may too)."""
    return [name for name in names() if _REGISTRY[name].servable]


def is_servable(name: str) -> bool:
    descriptor = describe(name)
    return descriptor is not None and descriptor.servable


def selection_of(name: str) -> tuple[str, bool]:
    """The metric a deployment picks ``name``'s best checkpoint by, and whether higher is better."""
    descriptor = describe(name)
    return descriptor.selection if descriptor is not None else (DEFAULT_SELECTION_METRIC, True)


def resolve(name: str) -> WorkloadDescriptor:
    """The descriptor as the cluster sees it: for ``"package.module:function"``, its code is imported, and an
    attribute that is a ``WorkloadDescriptor`` is used as it is; a function is its ``build``. Raises ValueError
    saying what is wrong with a name that does not resolve."""
    descriptor = _REGISTRY.get(name)
    if descriptor is not None:
        return descriptor
    if not is_custom_workload(name):
        raise ValueError(f'malformed workload name {name!r}: expected one of {names()} or "package.module:function"')
    target = _import_attribute(name, name, "function", callable_only=False)
    if isinstance(target, WorkloadDescriptor):
        return target
    if not callable(target):
        module_name, attribute = name.split(":")
        raise ValueError(f"workload {name!r}: {module_name!r} has no function {attribute!r}")
    return WorkloadDescriptor(name=name, build=target, description="custom workload")


def load_entrypoint(name: str) -> Callable[[Any], Any]:
    """A training function, ``"module:function"`` (a job spec's ``entrypoint``), imported on the cluster;
    ValueError saying what is missing."""
    if not is_custom_workload(name):
        raise ValueError(f'malformed entrypoint {name!r}: expected "module:function"')
    return _import_attribute(name, name, "function", kind="entrypoint")


def _resolve(ref: Ref, workload: str, what: str) -> Any:
    return ref if not isinstance(ref, str) else _import_attribute(ref, workload, what)


def _import_attribute(ref: str, workload: str, what: str, callable_only: bool = True, kind: str = "workload") -> Any:
    module_name, _, attribute = ref.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is None or not (module_name + ".").startswith(exc.name + "."):
            raise  # the module exists but one of ITS imports is missing: show that as it is
        raise ValueError(f"{kind} {workload!r}: module {module_name!r} is not installed") from exc
    target = getattr(module, attribute, None)
    if callable_only and not callable(target):
        raise ValueError(f"{kind} {workload!r}: {module_name!r} has no {what} {attribute!r}")
    return target


# --- the built-in workloads ------------------------------------------------------------------------
# Their code (model, data, predictor) is in workers/workloads/digits.py and tiny_gpt.py.


class DigitsConfig(WorkloadConfig):
    """The built-in ``digits`` workload: scikit-learn's bundled 8x8 digits, an MLP classifier."""

    hidden: int = Field(128, ge=1, le=8192, description="Width of the hidden layer.")
    batchnorm: bool = Field(False, description="Put a BatchNorm1d after the hidden layer.")
    val_fraction: float = Field(0.2, gt=0, lt=1, description="Share of the data held out.")

    def param_count(self) -> int:
        count = 64 * self.hidden + self.hidden + self.hidden * 10 + 10
        return count + (2 * self.hidden if self.batchnorm else 0)


class TinyGptConfig(WorkloadConfig):
    """The built-in ``tiny_gpt`` workload: a character-level decoder-only transformer on a text file."""

    text_path: str = Field(
        min_length=1,
        max_length=4096,
        json_schema_extra={DATA_PATH: True},
        description="A UTF-8 text file inside a data root the operator configured (ORCHESTRATOR_DATA_ROOTS, and "
        "<storage>/data), readable on every worker node; a relative path is taken from <storage>/data.",
    )
    context: int = Field(64, ge=2, le=8192, description="Characters of context per sample.")
    layers: int = Field(2, ge=1, le=96)
    width: int = Field(128, ge=8, le=16384, description="Embedding width; a multiple of heads.")
    heads: int = Field(4, ge=1, le=128)
    dropout: float = Field(0.0, ge=0, lt=1)
    val_fraction: float = Field(0.1, gt=0, lt=1)
    vocab_size: int = Field(256, ge=2, le=1_114_112, description="Byte-level vocabulary: 256 covers UTF-8.")

    @model_validator(mode="after")
    def _heads_divide_width(self) -> TinyGptConfig:
        if self.width % self.heads:
            raise ValueError(f"width ({self.width}) must be a multiple of heads ({self.heads})")
        return self

    def param_count(self) -> int:
        """Token + position embeddings, blocks (2 LayerNorms, qkv + proj, 4x MLP), final LayerNorm;
        the output head shares the token embedding's weights."""
        w, v = self.width, self.vocab_size
        per_block = 2 * (2 * w) + (3 * w * w + 3 * w) + (w * w + w) + (4 * w * w + 4 * w) + (4 * w * w + w)
        return v * w + self.context * w + self.layers * per_block + 2 * w


# Every built-in workload is a classifier over its output's last dimension, so the loop's val_accuracy
# is what its best checkpoint is chosen by.
DIGITS = register(
    WorkloadDescriptor(
        name="digits",
        config_model=DigitsConfig,
        build="workers.workloads.digits:build",
        build_model="workers.workloads.digits:build_model",
        predictor="workers.workloads.digits:DigitsPredictor",
        example_request=MappingProxyType({"inputs": [[0, 0, 5, 13, 9, 1, 0, 0] * 8]}),
        param_count=DigitsConfig.param_count,
        description="scikit-learn's bundled 8x8 digits (no download), an MLP classifier",
    )
)

TINY_GPT = register(
    WorkloadDescriptor(
        name="tiny_gpt",
        config_model=TinyGptConfig,
        build="workers.workloads.tiny_gpt:build",
        build_model="workers.workloads.tiny_gpt:build_model",
        predictor="workers.workloads.tiny_gpt:TinyGptPredictor",
        example_request=MappingProxyType({"prompt": "Hello", "max_new_tokens": 16}),
        param_count=TinyGptConfig.param_count,
        description="a character-level (UTF-8 byte) decoder-only transformer on a text file the user points at",
    )
)
