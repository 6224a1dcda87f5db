"""ORM models. The database is the source of truth; Ray is brought in line with it."""

from __future__ import annotations

import enum
import uuid
from datetime import UTC, datetime
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    Enum,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    false,
    text,
    true,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, declared_attr, mapped_column, relationship

from orchestrator_contract.states import DeploymentState, JobState, Role, TrialState


def utcnow() -> datetime:
    return datetime.now(UTC)


def new_id() -> str:
    return uuid.uuid4().hex


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC on both databases (SQLite hands back naive values otherwise)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_result_value(self, value: datetime | None, dialect) -> datetime | None:
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value


class Base(DeclarativeBase):
    type_annotation_map = {datetime: UTCDateTime, dict[str, Any]: JSON}


def _enum(cls: type[enum.Enum]) -> Enum:
    # Stored as plain strings (no native ENUM type) so SQLite and PostgreSQL behave the same.
    return Enum(cls, native_enum=False, length=16, values_callable=lambda e: [m.value for m in e])


QUOTA_FIELDS = ("max_cpus", "max_gpus", "max_running_jobs", "max_queued", "weight", "borrowing", "per_cluster")


class Project(Base):
    __tablename__ = "projects"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # Set by a cluster-wide admin: the highest priority a project's keys may give a job or sweep (None: 1000).
    max_priority: Mapped[int | None] = mapped_column(Integer, default=None)
    # Quota and fair share (docs/scheduling.md, orchestrator/scheduling): None is no limit. Set by a cluster-wide admin.
    max_cpus: Mapped[float | None] = mapped_column(Float, default=None)
    max_gpus: Mapped[float | None] = mapped_column(Float, default=None)
    max_running_jobs: Mapped[int | None] = mapped_column(Integer, default=None)
    max_queued: Mapped[int | None] = mapped_column(Integer, default=None)
    weight: Mapped[float] = mapped_column(Float, default=1.0, server_default="1")
    borrowing: Mapped[bool] = mapped_column(default=True, server_default=true())  # may use idle capacity past quota
    # Caps on single clusters, {cluster name: {max_cpus, max_gpus, max_running_jobs}} (docs/clusters.md).
    per_cluster: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    # Its member keys may submit jobs with preemptible: false (docs/scheduling.md); admins always may.
    allow_non_preemptible: Mapped[bool] = mapped_column(default=False, server_default=false())

    @property
    def quota(self) -> dict[str, Any]:
        """Its quota fields as ``orchestrator_contract.rest.Quota`` reads them."""
        return {name: getattr(self, name) for name in QUOTA_FIELDS} | {"per_cluster": self.per_cluster or {}}


class ApiKey(Base):
    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(64), default="")
    role: Mapped[Role] = mapped_column(_enum(Role))
    # sha256 of the key: keys are 256-bit random strings, so a fast hash is enough (no password stretching).
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16), default="")
    # A key acts in its project only, whatever its role. Cluster-wide (every project, making projects) is
    # only the admin key the first start prints when no ORCHESTRATOR_ADMIN_TOKEN is set; no route makes one.
    cluster_wide: Mapped[bool] = mapped_column(default=False)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime | None] = mapped_column(default=None)  # None: never; past it the key is 401
    # Written at most once a minute per key (repositories/projects.py), not on every request.
    last_used_at: Mapped[datetime | None] = mapped_column(default=None)


class Tenancy(enum.StrEnum):
    """Who may run on a cluster (docs/clusters.md): one project, or the projects bound to it, which then trust
    each other (a Ray cluster is one trust domain: whatever runs on it can reach everything else on it)."""

    DEDICATED = "dedicated"
    SHARED = "shared"


class Cluster(Base):
    """A Ray cluster the control plane drives (docs/clusters.md). Its token is never stored: ``token_ref`` says
    where the control plane reads it (``env:NAME`` or ``file:/path``). The name is fixed: runs keep it."""

    __tablename__ = "clusters"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    address: Mapped[str] = mapped_column(String(512))  # the dashboard URL (Ray's Jobs and State APIs)
    token_ref: Mapped[str | None] = mapped_column(String(512), default=None)
    labels: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    storage_root: Mapped[str | None] = mapped_column(String(1024), default=None)  # None: the service's storage
    # Where its Serve HTTP proxy is reached, the base of its deployments' URLs; None: the address's host on
    # its serve_port (the default cluster: ORCHESTRATOR_SERVE_PUBLIC_URL's rule).
    serve_url: Mapped[str | None] = mapped_column(String(512), default=None)
    serve_port: Mapped[int | None] = mapped_column(default=None)  # its Serve proxy's port; None: the setting's
    tenancy: Mapped[Tenancy] = mapped_column(_enum(Tenancy), default=Tenancy.SHARED)
    # The one a project with no bindings may use; the service's own cluster (`local` or RAY_ADDRESS's).
    is_default: Mapped[bool] = mapped_column(default=False, server_default=false())
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class ProjectCluster(Base):
    """A project may run on this cluster (``PUT /v1/projects/{id}/clusters``). A project with no row may use
    the default cluster only."""

    __tablename__ = "project_clusters"
    __table_args__ = (Index("ix_project_clusters_cluster", "cluster_id"),)  # who may use a cluster (its page)

    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"), primary_key=True)
    cluster_id: Mapped[str] = mapped_column(ForeignKey("clusters.id", ondelete="CASCADE"), primary_key=True)


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        UniqueConstraint("project_id", "idempotency_key", name="uq_jobs_project_idempotency_key"),
        Index("ix_jobs_state_priority", "state", "priority", "created_at"),
        # The list's keyset order (created_at, id), newest first: in a project, across projects (admins),
        # and for a state filter in either; name prefixes (LIKE 'p%') need the pattern operator class on
        # PostgreSQL whatever the database's collation (SQLite ignores it); label filters use job_labels'.
        Index("ix_jobs_project_created", "project_id", "created_at", "id"),
        Index("ix_jobs_created", "created_at", "id"),
        Index("ix_jobs_project_state_created", "project_id", "state", "created_at", "id"),
        Index("ix_jobs_state_created", "state", "created_at", "id"),
        Index("ix_jobs_project_name", "project_id", "name", postgresql_ops={"name": "varchar_pattern_ops"}),
        Index("ix_jobs_name", "name", postgresql_ops={"name": "varchar_pattern_ops"}),
        # Checkpoint upkeep's "finished since" and history retention's "ended before".
        Index("ix_jobs_finished_at", "finished_at"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    # The Ray cluster it runs on, by name (docs/clusters.md): placed at admission (a deployment at creation) and
    # kept; None: the default cluster (rows from before clusters).
    cluster: Mapped[str | None] = mapped_column(String(64), default=None)
    # QUEUED: the cluster the scheduler last planned it on, which it waits for (None: none it may use yet).
    waiting_on: Mapped[str | None] = mapped_column(String(64), default=None)
    name: Mapped[str] = mapped_column(String(128), default="")
    workload: Mapped[str] = mapped_column(String(256))
    spec: Mapped[dict[str, Any]]  # the full submitted spec, defaults filled in
    priority: Mapped[int] = mapped_column(Integer, default=0)
    state: Mapped[JobState] = mapped_column(_enum(JobState), default=JobState.QUEUED)
    reason: Mapped[str] = mapped_column(String(64), default="")
    message: Mapped[str] = mapped_column(Text, default="")
    attempt: Mapped[int] = mapped_column(Integer, default=0)  # 0 until first admitted
    idempotency_key: Mapped[str | None] = mapped_column(String(128), default=None)
    token_hash: Mapped[str] = mapped_column(String(64))  # the driver's credential for events
    # The attempt's driver gets a one-use claim code (Ray lists its environment), exchanged at its start for
    # the token (orchestrator.services.run_claims): the code's hash, and the hash of the exchanging driver's
    # nonce ("" until it is exchanged).
    claim_hash: Mapped[str] = mapped_column(String(64), default="", server_default="")
    claimed_by: Mapped[str] = mapped_column(String(64), default="", server_default="")
    # The run's own report of its end (state, reason, message, result, attempt), held until Ray confirms the
    # Ray job ended (orchestrator.services.reported_ends); None: none held.
    reported_end: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    plan: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)  # orchestrator_contract.jobs.TrainingPlan
    latest_metrics: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(default=None)
    finished_at: Mapped[datetime | None] = mapped_column(default=None)
    # Admitted on capacity beyond its project's quota (docs/scheduling.md): preemption takes these first.
    borrowing: Mapped[bool] = mapped_column(default=False, server_default=false())
    # Preemption (docs/scheduling.md, orchestrator/services/preemption.py): asked to checkpoint now and stop (None:
    # not asked), by whom and why; how many times it went back to QUEUED preempted (those attempts are not
    # counted against retries.max_attempts).
    preempt_requested_at: Mapped[datetime | None] = mapped_column(default=None)
    preempt_by: Mapped[str] = mapped_column(String(256), default="", server_default="")
    preemptions: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # When it last entered QUEUED (its submit, or a preemption's requeue): the starvation guard's clock. Set by
    # the state engine (orchestrator.states.jobs.queued_since); null on rows older than it: created_at.
    queued_at: Mapped[datetime | None] = mapped_column(default=None)
    # Its last preemption (orchestrator.states.jobs.preempted_record): when it went back to QUEUED and by whom,
    # kept after its reason moves on to what it waits for now; null and "" if it never was.
    last_preempted_at: Mapped[datetime | None] = mapped_column(default=None)
    last_preempted_by: Mapped[str] = mapped_column(String(256), default="", server_default="")
    # Hang detection (orchestrator/services/hangs.py): when the current attempt was found without progress and
    # every rank asked for its stack (None: not suspected), and the ranks' answers so far, by rank.
    stacks_requested_at: Mapped[datetime | None] = mapped_column(default=None)
    stacks: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    # Straggler detection (orchestrator/services/stragglers.py) in the current attempt: the ranks found slow, and
    # each rank's count of slow metric windows in a row.
    stragglers: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON, default=None)
    straggler_windows: Mapped[dict[str, int] | None] = mapped_column(JSON, default=None)
    # Each rank's Ray node id, as rank 0 reported with ``running`` ({"attempt": n, "nodes": [...]}): which node
    # a straggler or a hung rank was on (orchestrator/services/bad_nodes.py). Null before the first report.
    rank_nodes: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    # Each attempt's start-up timeline (orchestrator/services/startup.py): {attempt: {stage: ISO time}}.
    startup: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)

    labels: Mapped[list[JobLabel]] = relationship(
        cascade="all, delete-orphan", lazy="selectin", order_by="JobLabel.key"
    )

    @property
    def submission_id(self) -> str:
        """The Ray Jobs submission id of the current attempt: a retried submit can't start a copy."""
        return f"{self.id}-{self.attempt}"


class NodeFault(Base):
    """A hang or a straggler blamed on a Ray node (orchestrator/services/bad_nodes.py): enough of them within an
    hour keep the node out of placement for a cool-down. Cleared by a cluster admin, never deleted."""

    __tablename__ = "node_faults"
    __table_args__ = (Index("ix_node_faults_created_at", "created_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    node_id: Mapped[str] = mapped_column(String(128))
    kind: Mapped[str] = mapped_column(String(16))  # hung | straggler
    job_id: Mapped[str] = mapped_column(String(32))  # kept whatever becomes of the job
    attempt: Mapped[int] = mapped_column(Integer)
    message: Mapped[str] = mapped_column(String(1000), default="")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    cleared_at: Mapped[datetime | None] = mapped_column(default=None)
    cleared_by: Mapped[str] = mapped_column(String(256), default="")


class JobLabel(Base):
    """Labels in their own table so filtering is plain SQL on both SQLite and PostgreSQL."""

    __tablename__ = "job_labels"
    __table_args__ = (Index("ix_job_labels_key_value", "key", "value"),)

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    key: Mapped[str] = mapped_column(String(63), primary_key=True)
    value: Mapped[str] = mapped_column(String(63))


class _StateHistory:
    """The columns of one state transition (or the creation, ``from_state`` None) of a job, a sweep or a trial,
    written by the state engine (``orchestrator.states``). ``_states`` is the enum of the kind's states."""

    _states: ClassVar[type[enum.Enum]] = JobState

    @declared_attr
    def from_state(cls) -> Mapped[Any]:
        return mapped_column(_enum(cls._states), nullable=True, default=None)

    @declared_attr
    def to_state(cls) -> Mapped[Any]:
        return mapped_column(_enum(cls._states), nullable=False)

    reason: Mapped[str] = mapped_column(String(64), default="")
    message: Mapped[str] = mapped_column(Text, default="")
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class JobEvent(_StateHistory, Base):
    """State history: one row per transition, written by the one transition function."""

    __tablename__ = "job_events"
    # Pages are by id within a job (and the last transition is the highest id).
    __table_args__ = (Index("ix_job_events_job_id_id", "job_id", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))


class JobMetric(Base):
    __tablename__ = "job_metrics"
    # Also the index of a job's pages (job_id, then attempt and step: their keyset order): no job_id index
    # of its own on the biggest table.
    __table_args__ = (UniqueConstraint("job_id", "attempt", "step", name="uq_job_metrics_point"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer)
    epoch: Mapped[int] = mapped_column(Integer)
    step: Mapped[int] = mapped_column(Integer)
    values: Mapped[dict[str, Any]]
    # Seconds checkpoints blocked training since the previous point (goodput's "checkpoint_blocking").
    checkpoint_blocked_s: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Checkpoint(Base):
    __tablename__ = "checkpoints"
    __table_args__ = (
        UniqueConstraint("job_id", "path", name="uq_checkpoints_job_path"),
        Index("ix_checkpoints_job_step", "job_id", "step", "id"),  # a job's pages: by step, then id
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer)
    epoch: Mapped[int] = mapped_column(Integer)
    step: Mapped[int] = mapped_column(Integer)
    path: Mapped[str] = mapped_column(String(4096))
    size_bytes: Mapped[int] = mapped_column(Integer, default=0)
    metrics: Mapped[dict[str, Any]]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


# --- serving ------------------------------------------------------------------------------------------


# A name and a route belong to one live deployment at a time (Serve's application names and routes are
# cluster-wide); a deleted one's name may be used again.
_LIVE = "state != 'DELETED'"


class Deployment(Base):
    """A model served on Ray Serve: one Serve application, named after the deployment."""

    __tablename__ = "deployments"
    __table_args__ = (
        Index("uq_deployments_live_name", "name", unique=True, sqlite_where=text(_LIVE), postgresql_where=text(_LIVE)),
        Index(
            "uq_deployments_live_route",
            "route_prefix",
            unique=True,
            sqlite_where=text(_LIVE),
            postgresql_where=text(_LIVE),
        ),
        Index("ix_deployments_project_created", "project_id", "created_at", "id"),
        UniqueConstraint("project_id", "idempotency_key", name="uq_deployments_project_idempotency_key"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    # The Ray cluster it runs on, by name (docs/clusters.md): placed at admission (a deployment at creation) and
    # kept; None: the default cluster (rows from before clusters).
    cluster: Mapped[str | None] = mapped_column(String(64), default=None)
    name: Mapped[str] = mapped_column(String(63))
    workload: Mapped[str] = mapped_column(String(256))
    route_prefix: Mapped[str] = mapped_column(String(256))
    # POST /v1/deployments' Idempotency-Key, and the SHA-256 of the request that used it (a replay must match).
    idempotency_key: Mapped[str | None] = mapped_column(String(128), default=None)
    request_digest: Mapped[str] = mapped_column(String(64), default="", server_default="")
    state: Mapped[DeploymentState] = mapped_column(_enum(DeploymentState), default=DeploymentState.DEPLOYING)
    reason: Mapped[str] = mapped_column(String(64), default="")
    message: Mapped[str] = mapped_column(Text, default="")
    version: Mapped[int] = mapped_column(Integer, default=1)  # the newest version: what a rollout aims at
    live_version: Mapped[int | None] = mapped_column(Integer, default=None)  # the last one promoted to HEALTHY
    failed_version: Mapped[int | None] = mapped_column(Integer, default=None)  # a rollout that failed: not re-applied
    rollout_started_at: Mapped[datetime | None] = mapped_column(default=None)
    observed: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)  # Serve's last report
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)
    deleted_at: Mapped[datetime | None] = mapped_column(default=None)

    versions: Mapped[list[DeploymentVersion]] = relationship(
        cascade="all, delete-orphan", lazy="selectin", order_by="DeploymentVersion.version"
    )

    def get_version(self, number: int | None) -> DeploymentVersion | None:
        return next((v for v in self.versions if v.version == number), None)


class DeploymentVersion(Base):
    """What one version serves: a checkpoint (its path kept even after the job prunes the row) and settings."""

    __tablename__ = "deployment_versions"
    __table_args__ = (UniqueConstraint("deployment_id", "version", name="uq_deployment_versions_version"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    deployment_id: Mapped[str] = mapped_column(ForeignKey("deployments.id", ondelete="CASCADE"), index=True)
    version: Mapped[int] = mapped_column(Integer)
    checkpoint_id: Mapped[int | None] = mapped_column(ForeignKey("checkpoints.id", ondelete="SET NULL"), default=None)
    checkpoint_path: Mapped[str] = mapped_column(String(4096))
    job_id: Mapped[str | None] = mapped_column(ForeignKey("jobs.id", ondelete="SET NULL"), default=None)
    checkpoint: Mapped[dict[str, Any]]  # epoch, step, attempt, metrics of the checkpoint, copied
    config: Mapped[dict[str, Any]]  # the workload config of the job that wrote the checkpoint
    source: Mapped[dict[str, Any]]  # as the user gave it
    settings: Mapped[dict[str, Any]]  # replicas, batching, resources
    note: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class DeploymentEvent(Base):
    """State history of a deployment, written by its one transition function."""

    __tablename__ = "deployment_events"
    __table_args__ = (Index("ix_deployment_events_deployment_id_id", "deployment_id", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    deployment_id: Mapped[str] = mapped_column(ForeignKey("deployments.id", ondelete="CASCADE"))
    from_state: Mapped[DeploymentState | None] = mapped_column(_enum(DeploymentState), default=None)
    to_state: Mapped[DeploymentState] = mapped_column(_enum(DeploymentState))
    reason: Mapped[str] = mapped_column(String(64), default="")
    message: Mapped[str] = mapped_column(Text, default="")
    version: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


# --- sweeps ---------------------------------------------------------------------------------------


class Sweep(Base):
    """A hyperparameter search: one Ray Job (the sweep driver, running Ray Tune) per attempt. Its states
    are a job's (``JobState``) and follow the same rules."""

    __tablename__ = "sweeps"
    __table_args__ = (
        UniqueConstraint("project_id", "idempotency_key", name="uq_sweeps_project_idempotency_key"),
        Index("ix_sweeps_state_priority", "state", "priority", "created_at"),
        Index("ix_sweeps_project_created", "project_id", "created_at", "id"),
        Index("ix_sweeps_created", "created_at", "id"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    # The Ray cluster it runs on, by name (docs/clusters.md): placed at admission (a deployment at creation) and
    # kept; None: the default cluster (rows from before clusters).
    cluster: Mapped[str | None] = mapped_column(String(64), default=None)
    # QUEUED: the cluster the scheduler last planned it on, which it waits for (None: none it may use yet).
    waiting_on: Mapped[str | None] = mapped_column(String(64), default=None)
    name: Mapped[str] = mapped_column(String(128), default="")
    workload: Mapped[str] = mapped_column(String(256))
    spec: Mapped[dict[str, Any]]  # orchestrator_contract.sweeps.SweepSpec, defaults filled in, base strategy resolved
    priority: Mapped[int] = mapped_column(Integer, default=0)
    state: Mapped[JobState] = mapped_column(_enum(JobState), default=JobState.QUEUED)
    reason: Mapped[str] = mapped_column(String(64), default="")
    message: Mapped[str] = mapped_column(Text, default="")
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    idempotency_key: Mapped[str | None] = mapped_column(String(128), default=None)  # as Job.idempotency_key
    token_hash: Mapped[str] = mapped_column(String(64), default="")  # the sweep driver's credential
    claim_hash: Mapped[str] = mapped_column(String(64), default="", server_default="")  # as Job.claim_hash
    claimed_by: Mapped[str] = mapped_column(String(64), default="", server_default="")  # as Job.claimed_by
    reported_end: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)  # as Job.reported_end
    best_trial_id: Mapped[str | None] = mapped_column(String(32), default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(default=None)
    finished_at: Mapped[datetime | None] = mapped_column(default=None)
    borrowing: Mapped[bool] = mapped_column(default=False, server_default=false())  # as Job.borrowing
    # Preemption, as Job's (orchestrator/services/preemption.py): asked to pause its trials and stop.
    preempt_requested_at: Mapped[datetime | None] = mapped_column(default=None)
    preempt_by: Mapped[str] = mapped_column(String(256), default="", server_default="")
    preemptions: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    queued_at: Mapped[datetime | None] = mapped_column(default=None)  # as Job.queued_at
    last_preempted_at: Mapped[datetime | None] = mapped_column(default=None)  # as Job.last_preempted_at
    last_preempted_by: Mapped[str] = mapped_column(String(256), default="", server_default="")
    startup: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)  # as Job.startup

    @property
    def submission_id(self) -> str:
        return f"{self.id}-{self.attempt}"


class SweepEvent(_StateHistory, Base):
    """State history of a sweep, written by its one transition function."""

    __tablename__ = "sweep_events"
    __table_args__ = (Index("ix_sweep_events_sweep_id_id", "sweep_id", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    sweep_id: Mapped[str] = mapped_column(ForeignKey("sweeps.id", ondelete="CASCADE"))


class Trial(Base):
    """One configuration of a sweep, trained as one Ray Train run under Ray Tune."""

    __tablename__ = "trials"
    __table_args__ = (
        UniqueConstraint("sweep_id", "tune_id", name="uq_trials_sweep_tune_id"),
        Index("ix_trials_sweep_number", "sweep_id", "number", "id"),  # a sweep's pages: by number, then id
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    sweep_id: Mapped[str] = mapped_column(ForeignKey("sweeps.id", ondelete="CASCADE"))
    tune_id: Mapped[str] = mapped_column(String(64))  # Ray Tune's trial id, kept across driver restarts
    number: Mapped[int] = mapped_column(Integer)  # 1, 2, ... in the order the search created them
    config: Mapped[dict[str, Any]]  # the searched values, by path into the base spec
    state: Mapped[TrialState] = mapped_column(_enum(TrialState), default=TrialState.PENDING)
    reason: Mapped[str] = mapped_column(String(64), default="")
    message: Mapped[str] = mapped_column(Text, default="")
    iterations: Mapped[int] = mapped_column(Integer, default=0)  # epochs reported
    latest_metrics: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    best_metric: Mapped[float | None] = mapped_column(default=None)  # the sweep's metric, best epoch
    best_epoch: Mapped[int | None] = mapped_column(Integer, default=None)
    # The best epoch (by the sweep's metric; ties: the later) that still has a checkpoint, and its folder
    checkpoint_path: Mapped[str | None] = mapped_column(String(4096), default=None)
    stopped_early: Mapped[bool] = mapped_column(default=False)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(default=None)  # when the driver reported it running
    finished_at: Mapped[datetime | None] = mapped_column(default=None)
    # When its latest report arrived (each one is progress: a function may report many times an epoch, which
    # merge into one metric point), and hang detection (orchestrator/services/trial_hangs.py): when it was suspected hung and its ranks asked for
    # their stacks, their answers, and its last verdict (its workers ended, Ray Train restarted them) and count.
    progress_at: Mapped[datetime | None] = mapped_column(default=None)
    stacks_requested_at: Mapped[datetime | None] = mapped_column(default=None)
    stacks: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    hung_at: Mapped[datetime | None] = mapped_column(default=None)
    hangs: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # Straggler detection (orchestrator/services/stragglers.py), as a job's: the ranks found slow, and each
    # rank's count of slow windows (the trial's epochs) in a row.
    stragglers: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON, default=None)
    straggler_windows: Mapped[dict[str, int] | None] = mapped_column(JSON, default=None)
    # Its start-up timeline (orchestrator/services/startup.py): {stage: ISO time}, its first Train run's.
    startup: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)


class TrialEvent(_StateHistory, Base):
    """State history of a trial, written by the state engine; ``attempt`` is its sweep's attempt at the time."""

    __tablename__ = "trial_events"
    _states = TrialState
    __table_args__ = (Index("ix_trial_events_trial_id_id", "trial_id", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    trial_id: Mapped[str] = mapped_column(ForeignKey("trials.id", ondelete="CASCADE"))


class TrialMetric(Base):
    """One epoch of one trial: the point Ray Tune's scheduler saw."""

    __tablename__ = "trial_metrics"
    __table_args__ = (UniqueConstraint("trial_id", "epoch", name="uq_trial_metrics_epoch"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    trial_id: Mapped[str] = mapped_column(ForeignKey("trials.id", ondelete="CASCADE"), index=True)
    epoch: Mapped[int] = mapped_column(Integer)
    step: Mapped[int] = mapped_column(Integer, default=0)
    values: Mapped[dict[str, Any]]
    # The epoch's committed checkpoint while storage still holds it: the control plane's retention
    # (orchestrator/loops/retention.py) clears it when it deletes the folder.
    checkpoint_path: Mapped[str | None] = mapped_column(String(4096), default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


# --- users' code ----------------------------------------------------------------------------------------


class CodePackage(Base):
    """An uploaded code package of one project (``POST /v1/code``): content-addressed by the upload's SHA-256,
    stored once per project as a zip at ``<storage>/code/<project>/<sha256>.zip`` (``orchestrator.code_storage``)."""

    __tablename__ = "code_packages"
    __table_args__ = (UniqueConstraint("project_id", "sha256", name="uq_code_packages_project_sha256"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    sha256: Mapped[str] = mapped_column(String(64))  # of the uploaded bytes: the API's id is "sha256:<this>"
    size: Mapped[int] = mapped_column(BigInteger)  # the upload's bytes
    file_count: Mapped[int] = mapped_column(Integer)
    files: Mapped[list[Any]] = mapped_column(JSON)  # [{"path", "size"}], as stored
    # The stored zip's SHA-256 and size: its name in Ray's package store (gcs://_ray_pkg_<this>.zip).
    package_sha256: Mapped[str] = mapped_column(String(64))
    package_size: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # Set when a job or sweep starts with it; garbage collection counts from it (loops/code_gc.py).
    last_used_at: Mapped[datetime] = mapped_column(default=utcnow)


class LeaderLease(Base):
    """Who runs the background loops (``orchestrator.leader``): one row per lease, PostgreSQL only at run time.
    ``token`` grows by one at every change of holder: the fencing token each loop write checks."""

    __tablename__ = "leader_leases"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    holder: Mapped[str | None] = mapped_column(String(200))  # None: released, free to take
    token: Mapped[int] = mapped_column(BigInteger, default=0)
    expires_at: Mapped[datetime | None] = mapped_column()  # the database's clock
    acquired_at: Mapped[datetime | None] = mapped_column()


class UsageInterval(Base):
    """Usage accounting (docs/usage.md, ``orchestrator.usage``): one stretch of time a run held its reserved
    resources, written by the state engine's hooks (``orchestrator.states.usage_ledger``) in the transition's own
    transaction. ``ended_at`` None: still held (counted up to now). ``kind`` job, trial or deployment;
    ``subject_id`` the job, trial or deployment; ``sweep_id`` a trial's sweep. ``workers`` x the per-worker
    ``cpus``/``gpus``/``memory_gb`` is what was held (deployments: replicas x per-replica resources).
    ``wasted_from``: the stretch was lost (a failure, a preemption) from then to ``ended_at``."""

    __tablename__ = "usage_intervals"
    __table_args__ = (
        # A window [from, to) reads the stretches that end after ``from`` or are still open: by project, or all.
        Index("ix_usage_intervals_project_ended", "project_id", "ended_at"),
        Index("ix_usage_intervals_ended", "ended_at"),
        Index("ix_usage_intervals_subject", "subject_id", "id"),  # the open stretch of a run
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(16))
    subject_id: Mapped[str] = mapped_column(String(32))
    sweep_id: Mapped[str | None] = mapped_column(String(32), default=None)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    workers: Mapped[int] = mapped_column(Integer)
    cpus: Mapped[float] = mapped_column(default=0.0)
    gpus: Mapped[float] = mapped_column(default=0.0)
    memory_gb: Mapped[float] = mapped_column(default=0.0)
    started_at: Mapped[datetime] = mapped_column()
    ended_at: Mapped[datetime | None] = mapped_column(default=None)
    wasted_from: Mapped[datetime | None] = mapped_column(default=None)
    end_state: Mapped[str] = mapped_column(String(16), default="")
    end_reason: Mapped[str] = mapped_column(String(64), default="")
