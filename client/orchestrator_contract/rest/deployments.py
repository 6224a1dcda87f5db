"""What ``/v1/deployments`` answers (the request bodies are ``orchestrator_contract.deployments``'s)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from orchestrator_contract.base import FromAttributes
from orchestrator_contract.states import DeploymentState


class DeploymentVersionOut(FromAttributes):
    """One version of a deployment: a checkpoint and the settings it is served with."""

    version: int = Field(description="1, 2, ...: every create, update and rollback makes a new one.")
    checkpoint_id: int | None = Field(description="Null once the job's checkpoint row is gone; the path stays.")
    checkpoint_path: str = Field(description="The checkpoint folder served.")
    job_id: str | None = Field(description="The job that wrote the checkpoint; null once that job is gone.")
    checkpoint: dict[str, Any] = Field(description="The checkpoint's attempt, epoch, step and metrics.")
    source: dict[str, Any] = Field(description="The source as given.")
    settings: dict[str, Any] = Field(description="replicas, batching, resources, every default filled in.")
    note: str = Field(description="What made this version (e.g. a rollback to version n).")
    created_at: datetime = Field(description="When it was made (UTC).")


class ReplicaOut(BaseModel):
    """One Serve replica at the reconciler's last look."""

    replica_id: str = Field(description="Serve's id of the replica.")
    state: str = Field(description="Serve's state of the replica (RUNNING, STARTING, ...).")


class DeploymentOut(BaseModel):
    """A deployment: a checkpoint served over HTTP on Ray Serve, with its versions."""

    id: str = Field(description="The deployment's id (routes name it by `name`).")
    project_id: str = Field(description="The project it belongs to.")
    name: str = Field(description="Unique among live deployments cluster-wide: the Serve application's name.")
    workload: str = Field(
        description="The workload of the job that wrote the checkpoint (a training function's: its entrypoint)."
    )
    state: DeploymentState = Field(description="Where it is; DELETED is final.")
    reason: str = Field(description="Why it is in that state, as a code.")
    message: str = Field(description="The same, for people.")
    url: str = Field(description="Where to send requests (its cluster's Ray Serve HTTP proxy + route_prefix).")
    cluster: str | None = Field(
        None, description="The Ray cluster that serves it, fixed at creation (null: from before clusters, the default)."
    )
    route_prefix: str = Field(description="The path Serve answers it under; fixed at creation.")
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
    observed_at: datetime | None = Field(description="When the reconciler last looked at Serve; null: not yet.")
    versions: list[DeploymentVersionOut] = Field(description="Every version, oldest first.")
    created_at: datetime = Field(description="When it was created (UTC).")
    updated_at: datetime = Field(description="When the row last changed.")
    deleted_at: datetime | None = Field(description="When it was deleted; null while it is not.")


class DeploymentEventOut(FromAttributes):
    """One state change of a deployment, oldest first."""

    from_state: DeploymentState | None = Field(description="Null for the first event (the creation).")
    to_state: DeploymentState = Field(description="The state it entered.")
    reason: str = Field(description="Why, as a code.")
    message: str = Field(description="Why, for people.")
    version: int = Field(description="The version it concerns.")
    created_at: datetime = Field(description="When (UTC).")
