"""The service's one configuration object, read from environment variables."""

from __future__ import annotations

import os
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ORCHESTRATOR_", extra="ignore")

    database_url: str = Field(
        "sqlite:///./var/orchestrator.db",
        description="SQLAlchemy URL; PostgreSQL: postgresql+psycopg://user@host:5432/db. Migrations run on start.",
    )
    host: str = Field("127.0.0.1", description="Where the API listens.")
    port: int = Field(8000, ge=0, le=65535, description="The API's port.")
    api_workers: int = Field(
        1,
        ge=1,
        le=64,
        description="`orchestrator serve`'s processes (uvicorn workers) on the one port. Each is a replica, so more "
        "than 1 needs PostgreSQL (leader election picks the one that runs the loops) and RAY_ADDRESS (each would "
        "otherwise start the local Ray cluster); per-process figures (GET /metrics, the log-follow cap per key, "
        "the memory of API keys) are each worker's own. docs/benchmarks.md: what it buys on a small machine.",
    )
    storage: str = Field("./var/storage", description="Checkpoint and run storage (Ray Train storage_path).")
    var_dir: str = Field("./var", description="Local state the service owns: Ray token, logs.")
    admin_token: str | None = Field(
        None,
        description="Cluster-wide admin token(s) (bootstrap). Comma-separated to rotate: set 'new,old', restart "
        "the control plane (nothing is lost: jobs and keys live in the database), move clients to the new "
        "token, then drop the old one.",
    )
    api_key_cache_s: float = Field(
        5.0,
        ge=0,
        le=300,
        description="How long a process remembers a valid API key instead of looking it up in the database on "
        "each request (0: never). A revoke through this process ends it at once; a revoke through another "
        "replica or worker is seen here within this time. Expiry is always exact; unknown keys are never "
        "remembered (docs/security.md).",
    )
    # RAY_ADDRESS keeps Ray's own name: the dashboard address of an existing cluster to use.
    ray_address: str | None = Field(
        None,
        validation_alias=AliasChoices("RAY_ADDRESS"),
        description="Dashboard address of an existing Ray cluster (e.g. http://head:8265), whose nodes have this "
        "package installed; unset: the service starts a local one.",
    )
    cluster_name: str = Field(
        "local",
        pattern=r"^[a-z0-9]([a-z0-9-]{0,62})$",
        description="The name the service's own cluster (the local one, or RAY_ADDRESS's) is registered under: the "
        "default cluster, which every project with no cluster binding uses (docs/clusters.md).",
    )
    clusters: list[dict[str, Any]] = Field(
        default_factory=list,
        description="More Ray clusters, registered (or brought in line) at every start, as a JSON list of "
        'POST /v1/clusters bodies: [{"name", "address", "token_ref", "labels", "storage_root", '
        '"serve_url", "serve_port", "tenancy"}] (docs/clusters.md). How the Helm chart registers the clusters it creates; '
        "the API registers others.",
    )
    cluster_token_dir: str = Field(
        "/var/run/orchestrator/cluster-tokens",
        description="The only folder a registered cluster's `token_ref: file:/path` may name a file in (resolved, "
        "links followed); `env:` refs may name only variables starting RAY_TOKEN_. So that an admin key cannot make "
        "the control plane send one of its own files or variables to an address of the key's choosing "
        "(docs/clusters.md). The default cluster's token, which comes from the service's settings, is not confined.",
    )
    ray_gcs_port: int = Field(6390, description="GCS port of the local cluster the service starts.")
    ray_dashboard_port: int = Field(8265, description="Dashboard port of the local cluster.")
    ray_client_port: int = Field(10001, description="Ray client server port of the local cluster.")
    ray_num_cpus: int | None = Field(None, ge=1, description="Logical CPUs of the local cluster (default: all).")
    ray_num_gpus: int | None = Field(None, ge=0, description="Logical GPUs of the local cluster (default: detected).")
    public_url: str | None = Field(
        None, description="URL drivers use to reach the control plane (default http://host:port)."
    )
    max_body_mb: float = Field(
        1.0, gt=0, description="Largest request body (MB); past it a 413 before the body is parsed."
    )
    max_internal_body_mb: float = Field(
        16.0,
        gt=0,
        description="Largest body of the /internal routes drivers report through (a batch of up to 1000 events; "
        "a driver drops a batch refused with a 4xx, so this is larger).",
    )
    workload_packages: str = Field("", description="Comma-separated packages custom workloads may come from.")
    # --- input limits (docs/security.md, hole 6); past one a 4xx names the setting ---
    max_metric_names: int = Field(
        64,
        ge=1,
        le=10_000,
        description="Distinct metric names a run (a job; a trial's point) may report; "
        "past it the driver's batch is a 422, nothing of it applied.",
    )
    max_metric_name_chars: int = Field(64, ge=1, le=1024, description="Longest metric name (characters).")
    max_result_kb: float = Field(
        64.0, gt=0, description="Largest job result and trial config a driver may report (KB of JSON)."
    )
    max_label_filters: int = Field(16, ge=1, le=1000, description="label= filters one query may hold.")
    data_roots: str = Field(
        "",
        description="Comma-separated folders a job's data files (e.g. tiny_gpt's text_path) may come from, besides "
        "<storage>/data: a path that does not resolve (links followed) inside one is a 422 at submit.",
    )
    data_max_mb: float = Field(1024.0, gt=0, description="Largest data file a job may name (MB).")
    max_log_follows_per_key: int = Field(
        8, ge=1, le=10_000, description="Logs one key may follow (?follow=true) at once; past it a 429."
    )
    log_ray_chatter: bool = Field(
        False,
        description="Serve Ray Train's per-report and per-checkpoint lines in job logs (\"Reporting training "
        'result N: ...", "Checkpoint successfully created at: ..."); off, they are left out of what is served. '
        "The archived copy keeps them either way.",
    )
    log_follow_poll_s: float = Field(
        1.0, gt=0, description="How often a followed job's output is read again (once for all its followers)."
    )
    scheduler_interval_s: float = Field(1.0, gt=0, description="How often the scheduler admits queued jobs and sweeps.")
    fair_share_half_life_s: float = Field(
        600.0,
        ge=0,
        le=30 * 86400,
        description="Fair share between projects: a project's dominant share of the cluster is what it holds now or "
        "what it held before halved every this many seconds, whichever is larger (0: only what it holds now). "
        "docs/scheduling.md.",
    )
    starvation_s: float = Field(
        1800.0,
        gt=0,
        le=30 * 86400,
        description="A run queued this long goes first and holds a reservation: smaller runs may no longer pass it "
        "on resources it needs. docs/scheduling.md.",
    )
    reconciler_interval_s: float = Field(
        2.0, gt=0, description="How often the reconciler compares active runs with Ray (and restarts a local head)."
    )
    lease_s: float = Field(
        10.0,
        ge=0.3,
        le=300,
        description="PostgreSQL: the leader lease. Every replica serves the API; the one holding the lease runs the "
        "background loops, renews it every lease/3 and stops its loops after 2/3 of a lease without a renewal; "
        "another replica takes over within 2 x lease of a leader's death. SQLite: one process, always the leader.",
    )
    # Ray's own default. Each poll costs the workers CPU: 0.5 s measured 0.926 of torchrun's throughput
    # against 0.971 at 2 s (bench/train_throughput.py); the price is up to 2 s blocked per checkpoint.
    train_poll_interval_s: float = Field(
        2.0, gt=0, description="RAY_TRAIN_HEALTH_CHECK_INTERVAL_S for drivers: how long ray.train.report blocks."
    )
    train_preemption_watcher: bool | None = Field(
        None,
        description="Ray Train's preemption watcher (RAY_TRAIN_ENABLE_PREEMPTION_WATCHER): an extra actor per "
        "worker-group start that polls for nodes being drained, e.g. spot nodes about to go. Default: on for a "
        "cluster at RAY_ADDRESS, off for the local cluster the service starts itself, which is never drained.",
    )
    start_timeout_s: float = Field(
        600.0,
        gt=0,
        description="A job STARTING (or RESTARTING) longer than this is stopped and retried, or fails with "
        "start_timeout: the Ray job pending, its runtime env being set up, or its workers not placed.",
    )
    log_archive_interval_s: float = Field(
        5.0, gt=0, description="How often running jobs' output is copied to <storage>/<job>/logs/."
    )
    # --- preemption (docs/scheduling.md#preemption) ---
    preemption_grace_s: float = Field(
        60.0,
        gt=0,
        description="How long a preempted job's training loop has to write its checkpoint and stop; past it "
        "its Ray job is stopped all the same and it resumes from its last checkpoint.",
    )
    preemption_poll_s: float = Field(
        1.0,
        gt=0,
        le=60,
        description="How often a running job's rank 0 asks the control plane whether to checkpoint now and "
        "stop (ORCHESTRATOR_CONTROL_POLL_S in its environment).",
    )
    # --- hang detection (docs/jobs.md#hangs) ---
    hang_timeout_floor_s: float = Field(
        300.0,
        gt=0,
        description='The least a job\'s "auto" failure.hang_timeout_s can be: seconds of RUNNING without progress '
        "before it is judged hung, however fast its steps are.",
    )
    hang_stacks_wait_s: float = Field(
        30.0,
        gt=0,
        description="How long a job judged hung waits for every rank's stack before its attempt is ended all the "
        "same (a rank that never answers is named as such).",
    )
    hang_stacks_poll_s: float = Field(
        5.0,
        gt=0,
        le=60,
        description="How often each rank but rank 0 (which polls every preemption_poll_s) asks the control plane "
        "whether its stack is wanted (ORCHESTRATOR_STACKS_POLL_S in its environment).",
    )
    straggler_windows: int = Field(
        3,
        ge=1,
        le=1000,
        description="How many metric windows in a row a rank must be slower than failure.straggler_factor times the "
        "other ranks' median to be a straggler (docs/jobs.md#stragglers).",
    )
    # --- bad nodes (docs/jobs.md#bad-nodes) ---
    bad_node_faults: int = Field(
        2,
        ge=1,
        le=100,
        description="How many hangs or stragglers blamed on one Ray node within bad_node_window_s keep it out of "
        "placement (jobs' next attempts are placed on the other nodes while there are any).",
    )
    bad_node_window_s: float = Field(
        3600.0, gt=0, description="The window in which bad_node_faults faults make a node bad (seconds)."
    )
    bad_node_cooldown_s: float = Field(
        3600.0,
        gt=0,
        description="How long a bad node stays out of placement after its last fault (seconds); a cluster admin "
        "can clear it sooner (DELETE /v1/cluster/bad-nodes/{node_id}).",
    )
    # --- operations: metrics and logs (docs/deploy.md#metrics-and-logs-for-operators) ---
    metrics: Literal["off", "open", "admin"] = Field(
        "admin",
        description="GET /metrics (Prometheus text format): 'admin' needs a cluster-wide admin key (a bearer "
        "token the scraper sends), 'open' needs none (for a port only the scraper reaches), 'off' answers 404.",
    )
    log_format: Literal["text", "json"] = Field(
        "text",
        description="The control plane's log lines: 'text' for people, 'json' for a log pipeline (one JSON "
        "object a line: time, level, logger, message, and request_id, job_id, sweep_id, trial_id, deployment "
        "where known).",
    )

    # --- the web dashboard under /ui (api/ui/, docs/dashboard.md) ---
    ui_secret: str | None = Field(
        None,
        min_length=32,
        description="The key the dashboard's session cookies are signed with (at least 32 characters). Unset: a "
        "random one is made on first start and kept in <var_dir>/ui-secret (mode 0600), so sessions outlive a "
        "restart; replicas behind one address must share it: set it (the same on every replica). Changing it "
        "signs everybody out.",
    )
    ui_session_hours: float = Field(
        12.0,
        gt=0,
        le=24 * 30,
        description="How long a dashboard sign-in lasts; a revoked or expired key ends it at once.",
    )

    @cached_property
    def admin_tokens(self) -> tuple[str, ...]:
        return tuple(t.strip() for t in (self.admin_token or "").split(",") if t.strip())

    @cached_property
    def allowed_workload_packages(self) -> frozenset[str]:
        return frozenset(p.strip() for p in self.workload_packages.split(",") if p.strip())

    @property
    def control_plane_url(self) -> str:
        if self.public_url:
            return self.public_url.rstrip("/")
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host
        return f"http://{host}:{self.port}"

    @property
    def watch_preemption(self) -> bool:
        if self.train_preemption_watcher is not None:
            return self.train_preemption_watcher
        return self.ray_address is not None

    @cached_property
    def data_root_paths(self) -> tuple[str, ...]:
        """Where data files may come from, links resolved: <storage>/data (local storage only), then
        ORCHESTRATOR_DATA_ROOTS."""
        roots = [] if "://" in self.storage else [os.path.join(self.storage_path, "data")]
        roots += [r.strip() for r in self.data_roots.split(",") if r.strip()]
        return tuple(os.path.realpath(r) for r in roots)

    @property
    def storage_path(self) -> str:
        """Ray Train wants an absolute path or a URI."""
        if "://" in self.storage:
            return self.storage
        return str(Path(self.storage).resolve())

    @property
    def code_storage_path(self) -> str:
        """Where code packages are kept: ``code_storage``, else the checkpoint storage (absolute, or a URI)."""
        root = self.code_storage or self.storage
        return root if "://" in root else str(Path(root).resolve())

    @property
    def var_path(self) -> Path:
        return Path(self.var_dir).resolve()

    # --- serving (Ray Serve deployments) ---
    serve_host: str = Field("127.0.0.1", description="Where Ray Serve's HTTP proxy listens on the cluster's nodes.")
    serve_port: int = Field(8001, ge=1, le=65535, description="Ray Serve's HTTP proxy port.")
    serve_haproxy: bool = Field(
        True,
        description="The local cluster's Serve ingress: HAProxy straight to the replicas (Ray Serve's "
        "throughput-optimized mode) instead of Serve's Python proxy. A cluster at RAY_ADDRESS sets this itself.",
    )
    serve_public_url: str | None = Field(
        None, description="Base URL clients call deployments at (default http://serve_host:serve_port)."
    )
    serve_reconciler_interval_s: float = Field(2.0, gt=0, description="How often Serve is brought in line with the DB.")
    # Logical CPUs a replica reserves. 0 by default: the scheduler admits training jobs against the whole
    # cluster, and any fraction taken by a replica (0.1 of a 2-CPU cluster) would leave a 2 x 1-CPU job
    # pending in Ray forever. A replica still uses real CPU time when it answers requests.
    serve_replica_cpus: float = Field(0.0, ge=0, le=512, description="Default resources.cpus of a replica.")
    serve_rollout_timeout_s: float = Field(
        300.0, gt=0, description="A new version not healthy within this fails its rollout (the old one keeps serving)."
    )

    @property
    def serve_url(self) -> str:
        if self.serve_public_url:
            return self.serve_public_url.rstrip("/")
        host = "127.0.0.1" if self.serve_host in ("0.0.0.0", "::") else self.serve_host
        return f"http://{host}:{self.serve_port}"

    # --- checkpoint upkeep (orchestrator/loops/retention.py) ---
    checkpoint_sweep_interval_s: float = Field(
        10.0, gt=0, description="How often retention is re-applied and orphaned checkpoint folders are swept."
    )
    checkpoint_orphan_grace_s: float = Field(
        600.0,
        ge=0,
        description="A checkpoint folder of a running job that the database does not list is deleted once it is "
        "this old (a late report may still register it); a finished job's at once.",
    )
    history_days: float | None = Field(
        None,
        gt=0,
        description="Off by default. The metric points of a job that ended more than this many days ago are "
        "deleted, in bounded batches, by the retention loop; the job row, its events, checkpoints, latest metrics "
        "and result stay.",
    )

    # --- users' code packages (POST /v1/code: orchestrator/code_archive.py, services/code.py) ---
    code_storage: str = Field(
        "",
        description="Where users' code packages are kept (<it>/code/<project>/<sha256>.zip): a folder or a "
        "pyarrow URI that only the control plane reads; empty: ORCHESTRATOR_STORAGE. A Ray cluster whose nodes "
        "mount it lets the code running there read every project's packages, so give one no cluster mounts where "
        "projects must not see each other's code (the Helm chart does: docs/security.md). Changing it: copy the "
        "code/ folder over first, or the packages already uploaded are missing.",
    )
    code_max_mb: float = Field(
        100.0, gt=0, description="Largest code package upload (MB); past it a 413 as soon as the upload passes it."
    )
    code_max_files: int = Field(10_000, ge=1, le=1_000_000, description="Most files a code package may hold (422).")
    code_max_unpacked_mb: float = Field(
        400.0,
        gt=0,
        description="Largest total size of a code package's files, uncompressed (MB): a zip bomb is a 413 naming "
        "this setting, found before anything is stored.",
    )
    code_max_concurrent_uploads: int = Field(
        2,
        ge=1,
        le=64,
        description="Code uploads one API process receives and checks at once (each in a thread of its own, off the "
        "request threads); past it a 429 with Retry-After, at once.",
    )
    allow_requirements: bool = Field(
        True,
        description="Whether a job's code may name pip requirements (code.requirements, installed by Ray's "
        "runtime_env on the nodes); off: such a job is a 422.",
    )
    code_retention_days: float = Field(
        30.0,
        gt=0,
        description="A code package no job or sweep names, unused for this long, is deleted (storage, then row).",
    )
    code_gc_interval_s: float = Field(600.0, gt=0, description="How often unused code packages are looked for.")

    @property
    def code_max_bytes(self) -> int:
        return int(self.code_max_mb * 1024 * 1024)

    @property
    def code_max_unpacked_bytes(self) -> int:
        return int(self.code_max_unpacked_mb * 1024 * 1024)
