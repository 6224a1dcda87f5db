"""Response and request bodies of the public API (the job spec itself is ``workers.contract.jobs.JobSpec``, a sweep's
``workers.contract.sweeps.SweepSpec``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from orchestrator.db.models import Deployment, DeploymentState, Job, JobState, Role, Sweep, Trial, TrialState
from workers.contract.deployments import auth_of, max_body_mb_of
from workers.contract.sweeps import SweepSpec


class _FromORM(BaseModel):
    model_config = ConfigDict(from_attributes=True)


_MAX_PRIORITY = Field(
    None,
    ge=-1000,
    le=1000,
    description="The highest priority the project's keys may give a job or sweep (422 above it); null: no cap. "
    "Set by a cluster-wide admin only.",
)


class ProjectCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=64, pattern=r"^[a-z0-9][a-z0-9_-]*$")
    max_priority: int | None = _MAX_PRIORITY


class ProjectPatch(BaseModel):
    """``PATCH /v1/projects/{id}`` (cluster-wide admins): the fields given change."""

    model_config = ConfigDict(extra="forbid")
    max_priority: int | None = _MAX_PRIORITY


class ProjectOut(_FromORM):
    id: str
    name: str
    created_at: datetime
    max_priority: int | None = None


class KeyCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Role
    name: str = Field("", max_length=64)
    scope: Literal["project", "cluster"] = Field(
        "project", description="Always 'project': a key made under a project acts in that project only."
    )
    expires_at: datetime | None = Field(None, description="When the key stops working (UTC if no zone given).")
    expires_in_days: int | None = Field(None, ge=1, le=3650, description="Or: it stops working this many days on.")

    @field_validator("scope")
    @classmethod
    def _project_only(cls, scope: str) -> str:
        if scope != "project":
            raise ValueError(
                "a key made under a project acts in that project only, whatever its role; cluster-wide admin "
                "is not made through a project route: it is the ORCHESTRATOR_ADMIN_TOKEN of the service's "
                "environment (docs/security.md)"
            )
        return scope

    @field_validator("expires_at")
    @classmethod
    def _in_the_future(cls, expires_at: datetime | None) -> datetime | None:
        if expires_at is None:
            return None
        if expires_at.tzinfo is None:
            expires_at = expires_at.replace(tzinfo=UTC)
        if expires_at <= datetime.now(UTC):
            raise ValueError("expires_at is in the past")
        return expires_at

    @model_validator(mode="after")
    def _one_expiry(self) -> KeyCreate:
        if self.expires_at is not None and self.expires_in_days is not None:
            raise ValueError("give expires_at or expires_in_days, not both")
        return self

    def expiry(self, now: datetime) -> datetime | None:
        if self.expires_in_days is not None:
            return now + timedelta(days=self.expires_in_days)
        return self.expires_at


class KeyOut(_FromORM):
    id: str
    project_id: str
    name: str
    role: Role
    prefix: str
    cluster_wide: bool = Field(description="Acts on every project (only the key the first start prints).")
    created_at: datetime
    expires_at: datetime | None = Field(description="None: it does not expire.")
    last_used_at: datetime | None = Field(description="Recorded at most once a minute; None: never used.")


class KeyCreated(KeyOut):
    key: str = Field(description="The key itself. It is shown only in this response.")


class _RunOut(BaseModel):
    """What a job and a sweep both have: one Ray job per attempt, through the same lifecycle."""

    id: str
    project_id: str
    name: str
    workload: str
    state: JobState
    reason: str
    message: str
    attempt: int
    priority: int
    spec: dict[str, Any]
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None

    @classmethod
    def _common(cls, run: Job | Sweep) -> dict[str, Any]:
        return {name: getattr(run, name) for name in _RunOut.model_fields}


class JobOut(_RunOut):
    labels: dict[str, str]
    plan: dict[str, Any] | None = Field(
        description="Strategy that runs (auto resolved, with the reason), global batch, scaled LR."
    )
    latest_metrics: dict[str, Any] | None
    result: dict[str, Any] | None

    @classmethod
    def of(cls, job: Job) -> JobOut:
        return cls(
            **cls._common(job),
            labels={label.key: label.value for label in job.labels},
            plan=job.plan,
            latest_metrics=job.latest_metrics,
            result=job.result,
        )


class JobPage(BaseModel):
    items: list[JobOut]
    next_cursor: str | None = Field(description="Pass as ?cursor= for the next page; null on the last.")


class JobEventOut(_FromORM):
    from_state: JobState | None
    to_state: JobState
    reason: str
    message: str
    attempt: int
    created_at: datetime


class MetricOut(_FromORM):
    attempt: int
    epoch: int
    step: int
    values: dict[str, Any]
    created_at: datetime


class CheckpointOut(_FromORM):
    id: int = Field(description='Deploy exactly this checkpoint with a deployment source {"checkpoint_id": id}.')
    attempt: int
    epoch: int
    step: int
    path: str
    size_bytes: int
    metrics: dict[str, Any]
    created_at: datetime


# --- deployments (the request bodies are workers.contract.deployments's) -------------------------------


class DeploymentVersionOut(_FromORM):
    version: int
    checkpoint_id: int | None = Field(description="Null once the job's checkpoint row is gone; the path stays.")
    checkpoint_path: str
    job_id: str | None
    checkpoint: dict[str, Any] = Field(description="The checkpoint's attempt, epoch, step and metrics.")
    source: dict[str, Any] = Field(description="The source as given.")
    settings: dict[str, Any] = Field(description="replicas, batching, resources, every default filled in.")
    note: str
    created_at: datetime


class ReplicaOut(BaseModel):
    replica_id: str
    state: str


class DeploymentOut(BaseModel):
    id: str
    project_id: str
    name: str
    workload: str
    state: DeploymentState
    reason: str
    message: str
    url: str = Field(description="Where to send requests (Ray Serve's HTTP proxy + route_prefix).")
    route_prefix: str
    version: int = Field(description="The newest version: the one serving, or being rolled out.")
    serving_version: int | None = Field(description="The version Serve runs; null while nothing serves.")
    current: DeploymentVersionOut | None = Field(description="The serving version, with its source checkpoint.")
    target: DeploymentVersionOut = Field(description="The newest version (the same as current once promoted).")
    auth: Literal["project", "none"] = Field(
        description="Who may call `url`: 'project' (a key of this project in Authorization: Bearer) or 'none' "
        "(anyone who reaches Serve's port); the serving version's, else the newest's."
    )
    max_body_mb: float = Field(description="The largest request body the deployment reads (413 above it).")
    serve_status: str | None = Field(description="Serve's application status at the last look (RUNNING, ...).")
    replicas: list[ReplicaOut] = Field(description="Replica states at the reconciler's last look at Serve.")
    observed_at: datetime | None
    versions: list[DeploymentVersionOut] = Field(description="Every version, oldest first.")
    created_at: datetime
    updated_at: datetime
    deleted_at: datetime | None

    @classmethod
    def of(cls, deployment: Deployment, serve_url: str) -> DeploymentOut:
        versions = [DeploymentVersionOut.model_validate(v) for v in deployment.versions]
        by_number = {v.version: v for v in versions}
        observed = deployment.observed or {}
        serving = deployment.live_version if deployment.state != DeploymentState.DELETED else None
        enforced = by_number.get(serving) if serving is not None else None
        enforced = enforced or by_number[deployment.version]
        return cls(
            id=deployment.id,
            project_id=deployment.project_id,
            name=deployment.name,
            workload=deployment.workload,
            state=deployment.state,
            reason=deployment.reason,
            message=deployment.message,
            url=f"{serve_url}{deployment.route_prefix}",
            route_prefix=deployment.route_prefix,
            version=deployment.version,
            serving_version=serving,
            current=by_number.get(serving) if serving is not None else None,
            target=by_number[deployment.version],
            auth=auth_of(enforced.settings),
            max_body_mb=max_body_mb_of(enforced.settings),
            serve_status=observed.get("status"),
            replicas=[ReplicaOut(**r) for r in observed.get("replicas", [])],
            observed_at=observed.get("observed_at"),
            versions=versions,
            created_at=deployment.created_at,
            updated_at=deployment.updated_at,
            deleted_at=deployment.deleted_at,
        )


class DeploymentEventOut(_FromORM):
    from_state: DeploymentState | None
    to_state: DeploymentState
    reason: str
    message: str
    version: int
    created_at: datetime


# --- sweeps (the request body is workers.contract.sweeps.SweepSpec) ------------------------------------------


class TrialOut(_FromORM):
    id: str = Field(description='Deploy its best checkpoint with a deployment source {"trial_id": id}.')
    sweep_id: str
    number: int = Field(description="1, 2, ... in the order the search created the trials.")
    tune_id: str = Field(description="Ray Tune's id of the trial.")
    config: dict[str, Any] = Field(description="The searched values, by path into the base spec.")
    state: TrialState
    reason: str
    message: str
    iterations: int = Field(description="Epochs run (reported).")
    latest_metrics: dict[str, Any] | None
    best_metric: float | None = Field(description="The sweep's metric at the trial's best epoch.")
    best_epoch: int | None
    stopped_early: bool = Field(description="Stopped by the scheduler (ASHA) before its last epoch.")
    checkpoint_path: str | None = Field(
        description="The checkpoint of the best epoch (ties: the later) among those retention keeps: a folder that exists."
    )
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None = Field(None, description="When the sweep driver reported the trial running.")
    finished_at: datetime | None


class BestTrialOut(BaseModel):
    id: str
    config: dict[str, Any]
    metric: float
    epoch: int | None
    checkpoint_path: str | None


class SweepOut(_RunOut):
    metric: str
    mode: str
    total_trials: int = Field(description="Trials the sweep runs in all.")
    trials: dict[str, int] = Field(description="How many trials are in each state.")
    best_trial: BestTrialOut | None = Field(description="The best trial so far by the sweep's metric.")

    @classmethod
    def of(cls, sweep: Sweep, counts: dict[str, int], best: Trial | None) -> SweepOut:
        spec = sweep.spec
        best_out = None
        if best is not None and best.best_metric is not None:
            best_out = BestTrialOut(
                id=best.id,
                config=best.config,
                metric=best.best_metric,
                epoch=best.best_epoch,
                checkpoint_path=best.checkpoint_path,
            )
        return cls(
            **cls._common(sweep),
            metric=spec["metric"],
            mode=spec["mode"],
            total_trials=SweepSpec.model_validate(spec).total_trials,
            trials=counts,
            best_trial=best_out,
        )


class TrialMetricOut(_FromORM):
    epoch: int
    step: int
    values: dict[str, Any]
    checkpoint_path: str | None = Field(
        None,
        description="The epoch's checkpoint while retention keeps it (the trial's latest and best); null once deleted.",
    )
    created_at: datetime
