"""What a user sends to create or change a deployment, and the settings a version stores.

Plain pydantic, like the job spec: unknown keys are errors, and every default is filled in before a
version is stored, so a version's ``settings`` are exactly what Serve was asked to run.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from orchestrator_contract.base import Strict as _Strict
from orchestrator_contract.metrics import DEFAULT_MAX_METRIC_NAME_CHARS, check_metric_name
from orchestrator_contract.placement import Placement
from orchestrator_contract.workloads import LOOP_METRICS

# The Serve application the control plane asks Ray for (it never imports it: it needs ray and torch).
SERVE_APP_IMPORT_PATH = "workers.serve.app:build_app"
SERVE_DEPLOYMENT_NAME = "ModelServer"

NAME_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
ROUTE_PATTERN = r"^(/[A-Za-z0-9._~-]+)+$"


class SourceSpec(_Strict):
    """Exactly one of ``job_id``, ``trial_id``, ``checkpoint_id``."""

    job_id: str | None = Field(None, max_length=32, description="A job's best (or latest) checkpoint.")
    trial_id: str | None = Field(
        None, max_length=64, description="A sweep trial's best checkpoint (by the sweep's metric)."
    )
    checkpoint_id: int | None = Field(
        None, ge=1, description="One committed checkpoint (`GET /v1/jobs/{id}/checkpoints`)."
    )
    select: Literal["best", "latest"] = Field(
        "best",
        description="With job_id: the best checkpoint (by `metric`, else the job's keep_best metric, else its "
        "workload's, val_accuracy), or the latest.",
    )
    metric: str | None = Field(
        None,
        max_length=DEFAULT_MAX_METRIC_NAME_CHARS,
        description='With job_id and select best: the metric its checkpoints carry that "best" goes by (a training '
        "function's job has no default: give one, or select latest).",
    )
    mode: Literal["max", "min"] | None = Field(
        None,
        description="With metric: max (higher is better) or min. Default: min for val_loss and train_loss, else max.",
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> SourceSpec:
        given = [k for k in ("job_id", "trial_id", "checkpoint_id") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                "source needs exactly one of job_id, trial_id or checkpoint_id"
                + (f" (got {', '.join(given)})" if given else "")
            )
        if self.select != "best" and self.job_id is None:
            raise ValueError("select applies to a job_id source only")
        if self.metric is not None:
            check_metric_name(self.metric)
            if self.job_id is None or self.select != "best":
                raise ValueError("metric applies to a job_id source with select best only")
            if self.mode is None:
                self.mode = LOOP_METRICS.get(self.metric, "max")
        elif self.mode is not None:
            raise ValueError("mode goes with metric: give both")
        return self


class AutoscalingSpec(_Strict):
    min: int = Field(1, ge=0, le=100, description="Fewest replicas (0 scales to zero when idle).")
    max: int = Field(ge=1, le=100, description="Most replicas.")
    target_ongoing_requests: float | None = Field(
        None,
        gt=0,
        le=10_000,
        description="Requests in flight per replica the autoscaler aims at "
        "(default: the batch size, so a replica fills its batches before another starts).",
    )

    @model_validator(mode="after")
    def _min_le_max(self) -> AutoscalingSpec:
        if self.min > self.max:
            raise ValueError(f"replicas.min ({self.min}) must not exceed replicas.max ({self.max})")
        return self


class BatchingSpec(_Strict):
    max_batch_size: int = Field(
        16, ge=1, le=512, description="Requests per forward pass at most; 1 turns batching off."
    )
    wait_ms: float = Field(2.0, ge=0, le=1000, description="How long a batch waits to fill.")


class ResourcesSpec(_Strict):
    cpus: float | None = Field(
        None,
        ge=0,
        le=512,
        description="Logical CPUs each replica reserves (default ORCHESTRATOR_SERVE_REPLICA_CPUS, 0).",
    )
    gpus: float = Field(0.0, ge=0, le=16, description="GPUs each replica reserves.")


Replicas = Annotated[int, Field(ge=1, le=100)] | AutoscalingSpec
Auth = Literal["project", "none"]
AUTH_DESCRIPTION = (
    "Who may call the deployment's URL: 'project' (a key of the deployment's project in "
    "Authorization: Bearer, checked by the Serve replica) or 'none' (anyone who reaches Serve's port)."
)
MAX_BODY_MB = 64.0
MAX_BODY_DESCRIPTION = "The largest request body a replica reads, in MB; a larger one is a 413 before it is parsed."


class DeploymentCreate(_Strict):
    """``POST /v1/deployments``. Only ``name`` and ``source`` are required."""

    name: str = Field(description="Lowercase letters, digits and '-', at most 63; the Serve application's name.")
    source: SourceSpec
    route_prefix: str | None = Field(None, max_length=256, description="HTTP path prefix on Serve (default /<name>).")
    replicas: Replicas = Field(1, description="A fixed count, or {min, max, target_ongoing_requests} to autoscale.")
    batching: BatchingSpec | None = Field(default_factory=BatchingSpec, description="null turns batching off.")
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec, description="Per replica.")
    auth: Auth = Field("project", description=AUTH_DESCRIPTION)
    max_body_mb: float = Field(1.0, gt=0, le=MAX_BODY_MB, description=MAX_BODY_DESCRIPTION)
    placement: Placement | None = Field(
        None,
        description="Which Ray cluster serves it, as a job's placement (docs/clusters.md); null: the project's "
        "cluster with the most free capacity. Fixed for the deployment's life: its URL names the cluster.",
    )

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if not re.match(NAME_PATTERN, name):
            raise ValueError(
                "name must be 1 to 63 lowercase letters, digits or '-', starting and ending with a letter or digit"
            )
        return name

    @field_validator("route_prefix")
    @classmethod
    def _route(cls, route: str | None) -> str | None:
        if route is not None:
            check_route(route)
        return route

    @model_validator(mode="after")
    def _default_route(self) -> DeploymentCreate:
        if self.route_prefix is None:
            self.route_prefix = f"/{self.name}"
        return self


class DeploymentPatch(_Strict):
    """``PATCH /v1/deployments/{name}``: a new source and/or new settings make a new version.

    Omitted fields keep the current version's value; ``batching: null`` turns batching off.
    """

    source: SourceSpec | None = None
    route_prefix: str | None = Field(None, description="Fixed at creation: only the current value is accepted.")
    replicas: Replicas | None = None
    batching: BatchingSpec | None = None
    resources: ResourcesSpec | None = None
    auth: Auth | None = Field(None, description=AUTH_DESCRIPTION)
    max_body_mb: float | None = Field(None, gt=0, le=MAX_BODY_MB, description=MAX_BODY_DESCRIPTION)

    @model_validator(mode="after")
    def _something(self) -> DeploymentPatch:
        if not self.model_fields_set:
            raise ValueError("nothing to change: give source, replicas, batching, resources, auth and/or max_body_mb")
        return self


def check_route(route: str) -> None:
    if route.startswith("/-"):
        raise ValueError("route_prefix must not start with '/-' (Ray Serve's own routes live there)")
    if not re.match(ROUTE_PATTERN, route):
        raise ValueError("route_prefix must look like /name or /a/b, without a trailing '/'")


def settings_of(
    replicas: int | AutoscalingSpec,
    batching: BatchingSpec | None,
    resources: ResourcesSpec,
    default_cpus: float,
    auth: str = "project",
    max_body_mb: float = 1.0,
) -> dict[str, Any]:
    """The settings a version stores, every default filled in (batching off is max_batch_size 1).

    A version stored before ``auth`` existed has neither ``auth`` nor ``max_body_mb``: it is served as
    ``auth: none`` with a 1 MB cap (``auth_of``), as it was created."""
    batch = batching or BatchingSpec(max_batch_size=1, wait_ms=0)
    if isinstance(replicas, AutoscalingSpec):
        replicas_out: int | dict = replicas.model_dump()
        if replicas.target_ongoing_requests is None:
            replicas_out["target_ongoing_requests"] = float(max(1, batch.max_batch_size))
    else:
        replicas_out = replicas
    cpus = default_cpus if resources.cpus is None else resources.cpus
    return {
        "replicas": replicas_out,
        "batching": batch.model_dump(),
        "resources": {"cpus": cpus, "gpus": resources.gpus},
        "auth": auth,
        "max_body_mb": float(max_body_mb),
    }


def auth_of(settings: dict[str, Any]) -> str:
    """A version's auth mode; 'none' for a version stored before deployments could require a key."""
    return settings.get("auth", "none")


def max_body_mb_of(settings: dict[str, Any]) -> float:
    return float(settings.get("max_body_mb", 1.0))
