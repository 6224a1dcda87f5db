"""The cluster backend: the only way the control plane talks to Ray.

This module holds the interface and plain types (no ray import); ``ray_backend`` implements it and
``local_cluster`` starts the local Ray head that ``make run`` uses.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import BinaryIO, Protocol

from orchestrator.admission import ClusterCapacity


class RunStatus(enum.StrEnum):
    """Ray Jobs' statuses, plus MISSING for a submission Ray no longer knows."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    STOPPED = "STOPPED"
    MISSING = "MISSING"

    @property
    def finished(self) -> bool:
        return self in (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.STOPPED, RunStatus.MISSING)


@dataclass(frozen=True)
class RunInfo:
    status: RunStatus
    message: str = ""
    exit_code: int | None = None  # the driver's, once it has exited (orchestrator_contract.jobs.DriverExit)
    # FAILED before the driver ran: Ray could not place its supervisor (the node it must go on is gone, draining,
    # or not yet back: a head restarting). No attempt of the run's, so the reconciler submits it again.
    unschedulable: bool = False


PackageOpener = Callable[[], AbstractContextManager[BinaryIO]]


@dataclass(frozen=True)
class ClusterNode:
    """One alive Ray node and the resources it holds (``{"CPU": 8.0, "GPU": 1.0, ...}``)."""

    node_id: str
    address: str
    is_head: bool
    total: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class RayJob:
    """A live (PENDING or RUNNING) Ray job and the CPUs/GPUs it holds now: its driver's entrypoint resources, its
    placement groups, and its actors and running tasks outside them (``orchestrator.backend.ray_jobs``)."""

    submission_id: str | None  # None: a driver that connected to Ray itself (``job_id`` names it)
    job_id: str | None  # Ray's own job id (hex); None until a submission's driver starts
    kind: str  # "submission" (Ray's Jobs API) or "driver"
    status: str
    entrypoint: str
    holds: dict[str, float] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.submission_id or f"driver:{self.job_id}"


class BackendUnavailable(Exception):
    """The cluster could not be reached; callers retry on their next tick."""


class SubmissionTaken(Exception):
    """Ray already has a job under the submission id that is not this submission (its environment differs): someone
    holding the cluster's Ray token submitted it first. Never followed as the run's."""


class RunNotFound(Exception):
    """Ray has no record of the submission (its own answer, not an error on the way)."""


@dataclass(frozen=True)
class LogChunk:
    """What a driver printed next. ``at_end``: it reached the end of what the driver had printed when it was
    read (a chunk may be empty and only say that), so what came before is the whole log of that moment."""

    text: str
    at_end: bool = False


class ClusterBackend(Protocol):
    def capacity(self, fresh: bool = False) -> ClusterCapacity:
        """What the cluster's alive nodes hold; may be a few seconds old unless ``fresh``."""

    def nodes(self) -> list[ClusterNode]:
        """The alive nodes, each with what it holds (the dashboard's cluster page); may be a few seconds old."""

    def live_jobs(self) -> list[RayJob]:
        """Every live Ray job on the cluster, the control plane's and any other (``services.foreign_jobs`` tells
        them apart), with what each holds; may be a few seconds old."""

    def worker_nodes(self, submission_id: str) -> set[str]:
        """The node ids Ray lists the submission's live Ray Train workers on (empty before its driver starts)."""

    def submit(self, submission_id: str, entrypoint: str, runtime_env: dict, metadata: dict[str, str]) -> None:
        """Start a driver with Ray's ``runtime_env`` exactly as given (built by the control plane:
        ``orchestrator.services.launch.runtime_env``). Submitting an id that already exists with the same
        environment variables is a no-op, never a second copy; under other ones (not this submission) it raises
        SubmissionTaken."""

    def info(self, submission_id: str) -> RunInfo: ...

    def stop(self, submission_id: str) -> None:
        """Ask the run to stop; a run that is gone or finished is fine."""

    def forget(self, submission_id: str) -> None:
        """Delete Ray's record of an ended submission, so that its id may be submitted again; one Ray has no
        record of is fine."""

    def logs(self, submission_id: str) -> str | None:
        """The driver's output (Ray forwards worker output into it); None when Ray has none."""

    def tail_logs(self, submission_id: str) -> AsyncIterator[LogChunk]:
        """The driver's output from its first byte, then each new piece as it is printed, each byte once; ends
        once the run has ended and all of it was sent (or when the connection breaks: the caller asks
        ``info``). Raises RunNotFound when Ray has no such submission, BackendUnavailable when unreachable."""

    def upload_package(self, uri: str, open_package: PackageOpener, size: int) -> bool:
        """Make sure Ray's package store holds the zip ``uri`` names (``gcs://_ray_pkg_<sha256>.zip``, what a
        runtime_env's ``working_dir`` may name): asks first, and only if it is missing opens the package
        (``open_package()``: a context manager over its ``size`` bytes) and uploads it. Returns whether it
        uploaded. Raises BackendUnavailable when Ray can't be reached or refuses it."""

    # --- Ray Serve, driven declaratively (as KubeRay's RayService does) ---

    def serve_status(self) -> ServeStatus:
        """Serve's applications as the cluster reports them (none when Serve isn't running)."""

    def apply_serve(self, config: dict) -> None:
        """Replace Serve's whole set of applications with ``config`` (a multi-application config:
        ``{"http_options": ..., "applications": [...]}``); starts Serve if it isn't running.
        Raises ServeConfigRejected when Serve refuses the config, BackendUnavailable when unreachable."""


class ServeConfigRejected(Exception):
    """Serve refused a config (it answers 400 with why)."""


@dataclass(frozen=True)
class ServeReplica:
    replica_id: str
    state: str  # Serve's ReplicaState: STARTING, UPDATING, RECOVERING, RUNNING, STOPPING, PENDING_MIGRATION


@dataclass(frozen=True)
class ServeApp:
    """One Serve application. ``status`` is Serve's ApplicationStatus: NOT_STARTED, DEPLOYING, RUNNING,
    DEPLOY_FAILED, DELETING or UNHEALTHY; ``config`` is the application config as it was submitted."""

    name: str
    status: str
    message: str = ""
    config: dict | None = None
    deployment_status: str = ""
    deployment_message: str = ""
    replicas: tuple[ServeReplica, ...] = ()
    target_replicas: int = 0


@dataclass(frozen=True)
class ServeStatus:
    running: bool
    apps: dict[str, ServeApp] = field(default_factory=dict)
    http_port: int | None = None
