"""The control plane in one object: database, cluster backend, and the background loops (scheduler, reconcilers, retention) that drive Ray.

Every replica serves the API. On PostgreSQL the loops run on the one replica that holds the leader lease
(``orchestrator.leader``): each replica starts them, and a tick runs only while it leads, its commits fenced by
the lease's token. On SQLite there is one process, no lease, and the loops run as they always did."""

from __future__ import annotations

import logging

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from orchestrator.backend import ClusterBackend
from orchestrator.backend.metered import MeteredBackend
from orchestrator.backend.registry import ClusterBackends
from orchestrator.code_storage import CodeStorage
from orchestrator.db.engine import make_engine, make_session_factory
from orchestrator.db.migrate import upgrade_head
from orchestrator.db.models import Role
from orchestrator.key_cache import KeyCache
from orchestrator.leader import LeaseElector, install_fencing
from orchestrator.loops.code_gc import CodeCollector
from orchestrator.loops.log_archive import LogArchive, LogArchiver
from orchestrator.loops.reconciler import Reconciler
from orchestrator.loops.retention import CheckpointJanitor
from orchestrator.loops.runner import Loop
from orchestrator.loops.scheduler import Scheduler
from orchestrator.loops.serving import ServingReconciler
from orchestrator.metrics import Metrics
from orchestrator.repositories import clusters as clusters_repo
from orchestrator.repositories import projects as projects_repo
from orchestrator.services.logs import LogFollows
from orchestrator.services.runs import revoke_driver_tokens
from orchestrator.settings import Settings
from orchestrator.storage import CheckpointStorage, RunStorages
from orchestrator.use_cases.clusters import register_from_settings

log = logging.getLogger(__name__)


class ControlPlane:
    def __init__(self, settings: Settings, backend: ClusterBackend | None = None, run_loops: bool = True):
        self.settings = settings
        self.engine = make_engine(settings.database_url)
        self.sessions: sessionmaker[Session] = make_session_factory(self.engine)
        # GET /metrics: this control plane's own registry, which its sessions name for the state engine.
        self.metrics = Metrics()
        self.metrics.watch_database(self.sessions)
        # Valid API keys this process has seen, for a few seconds (ORCHESTRATOR_API_KEY_CACHE_S): a request
        # then needs no key lookup of its own (api/deps.py); a revoke here empties it (api/routers/projects.py).
        self.api_keys = KeyCache(settings.api_key_cache_s)
        self._backend = backend
        self.backends: ClusterBackends | None = None  # start(): one backend per registered cluster
        self.run_loops = run_loops
        self.local_cluster = None
        self.loops: list[Loop] = []
        self.scheduler_loop: Loop | None = None  # woken by a submission (wake_scheduler)
        # PostgreSQL: who runs the loops is elected (several replicas may share the database).
        self.elector: LeaseElector | None = None
        if run_loops and self.engine.dialect.name == "postgresql":
            self.elector = LeaseElector(self.engine, settings.lease_s)
            install_fencing(self.sessions)
        self._adopted_token: int | None = None  # the term in which the reconciler last ticked first
        # Checkpoint retention and the orphan sweeper (also run by the events endpoint after a checkpoint).
        # Each run's folder is on its cluster's storage_root, else on the service's own storage (docs/clusters.md).
        self.storages = RunStorages(CheckpointStorage(settings.storage_path), self._storage_root)
        self.checkpoints = CheckpointJanitor(self.sessions, self.storages, settings)
        self.log_archive = LogArchive(self.storages)
        self.code_storage = CodeStorage(settings.code_storage_path)  # users' code packages, <code storage>/code/

    def _storage_root(self, cluster: str, session: Session | None) -> str | None:
        return self.backends.storage_root(cluster, session) if self.backends is not None else None

    @property
    def backend(self) -> ClusterBackend:
        assert self._backend is not None, "ControlPlane.start() sets up the backend"
        return self._backend

    @property
    def is_leader(self) -> bool:
        """Whether this replica runs the background loops now (/readyz's ``leader``)."""
        if self.elector is None:
            return self.run_loops
        return self.elector.is_leader

    def _leads(self) -> bool:
        return self.elector is not None and self.elector.is_leader

    def _adopted(self) -> bool:
        """Leading, and the reconciler has had its first tick of this term: adopt before admitting."""
        return self._leads() and self._adopted_token == self.elector.token

    def _reconcile_first(self, reconciler: Reconciler):
        def tick() -> None:
            term = self.elector.token if self.elector is not None else None
            try:
                reconciler.tick()
            finally:
                self._adopted_token = term

        return tick

    def prepare_database(self) -> None:
        """The newest schema, and an admin key (printed once) if none exists: the first thing start() does.
        `orchestrator serve` with several workers does it once before they start, so that they do not race."""
        upgrade_head(self.engine)
        self._bootstrap_keys()

    def start(self) -> None:
        self.prepare_database()
        if self._backend is None:
            self._backend = self._connect_ray()
        address, token_ref = self._default_cluster_address()
        # One backend per registered cluster (docs/clusters.md), each Ray call counted by method and outcome,
        # whoever makes it (loops, services, routes). The service's own cluster is the default one.
        self.backends = ClusterBackends(
            self.sessions,
            connect_ray,
            wrap=lambda backend: MeteredBackend(backend, self.metrics.ray_calls),
            token_dir=self.settings.cluster_token_dir,
        )
        self.backends.set_default(self.settings.cluster_name, self._backend)
        self._backend = self.backends.default
        self._register_clusters(address, token_ref)
        self.backends.refresh()
        self.log_follows = LogFollows(
            self.sessions,
            self.backends,
            self.log_archive,
            self.settings.max_log_follows_per_key,
            self.settings.log_follow_poll_s,
            keep_ray_chatter=self.settings.log_ray_chatter,
        )
        scheduler = Scheduler(self.sessions, self.backends, self.settings)
        reconciler = Reconciler(self.sessions, self.backends, self.settings)
        last_success = self.metrics.loop_last_success
        elected = self.elector is not None
        # A loop of an elected replica: ticks while it leads, fenced; the others wait for the first reconcile.
        lead = {"fence": self.elector, "runs_now": self._leads} if elected else {}
        after_adopting = {"fence": self.elector, "runs_now": self._adopted} if elected else {}
        reconcile = Loop(
            "reconciler", self._reconcile_first(reconciler), self.settings.reconciler_interval_s, last_success, **lead
        )
        if self.elector is not None:
            self.elector.start()  # one try at once: a lone replica leads from its start
        # Adopt what is already running before admitting anything new (a follower adopts when it takes over).
        if (self.elector is None or self.elector.is_leader) and not reconcile.run_once():
            log.error("the first reconcile failed; the loop will try again")
        if self.run_loops:
            # The names are the `loop` label of orchestrator_loop_last_success_timestamp_seconds.
            self.scheduler_loop = Loop(
                "scheduler", scheduler.tick, self.settings.scheduler_interval_s, last_success, **after_adopting
            )
            self.loops = [
                reconcile,
                self.scheduler_loop,
                Loop(
                    "retention",
                    self.checkpoints.tick,
                    self.settings.checkpoint_sweep_interval_s,
                    last_success,
                    **after_adopting,
                ),
                # Re-applies every live deployment's Serve config after a Ray or control-plane restart.
                Loop(
                    "serving",
                    ServingReconciler(self.sessions, self.backends, self.settings).tick,
                    self.settings.serve_reconciler_interval_s,
                    last_success,
                    **after_adopting,
                ),
                Loop(
                    "code_gc",
                    CodeCollector(self.sessions, self.code_storage, self.settings).tick,
                    self.settings.code_gc_interval_s,
                    last_success,
                    **after_adopting,
                ),
                Loop(
                    "log_archive",
                    LogArchiver(self.sessions, self.backends, self.log_archive).tick,
                    self.settings.log_archive_interval_s,
                    last_success,
                    **after_adopting,
                ),
            ]
            if self.local_cluster is not None:  # ours to keep alive; a RAY_ADDRESS cluster is its owner's
                self.loops.append(
                    Loop("ray_head", self._keep_local_head, self.settings.reconciler_interval_s, last_success)
                )
            for loop in self.loops:
                loop.start()

    def serve_urls(self, session: Session) -> dict[str | None, str]:
        """Each cluster's Serve base URL: a deployment's URL is its cluster's (docs/clusters.md)."""
        return clusters_repo.serve_urls(session, self.settings.serve_url, self.settings.serve_port)

    def wake_scheduler(self) -> None:
        """A run was submitted: the scheduler looks now (``Loop.wake``), so one that fits is admitted at once (the
        start-up timeline's ``admitted``). Nothing where this process runs no loops."""
        if self.scheduler_loop is not None:
            self.scheduler_loop.wake()

    def stop(self) -> None:
        for loop in self.loops:
            loop.stop()
        if self.elector is not None:  # after the loops: no write of ours can follow the release
            self.elector.stop(release=True)
        if self.local_cluster is not None:
            self.local_cluster.stop()
        self.engine.dispose()

    def _keep_local_head(self) -> None:
        if not self.local_cluster.is_gone():
            return
        # Drivers of the lost head may linger a while, unable to judge their runs: their reports are
        # refused from now on, and the reconciler starts each job's next attempt on the new head.
        with self.sessions.begin() as session:
            revoked = revoke_driver_tokens(session, "the Ray head was lost")
        log.warning("revoked the driver tokens of %d active job(s) and sweep(s) of the lost Ray head", revoked)
        self.local_cluster.restart()

    def _register_clusters(self, address: str, token_ref: str | None) -> None:
        """The default cluster and ORCHESTRATOR_CLUSTERS, registered or brought in line (docs/clusters.md). Replicas
        starting together may race to insert the same row: the loser tries again and finds it."""
        for last_try in (False, True):
            try:
                with self.sessions.begin() as session:
                    clusters_repo.ensure_default_cluster(session, self.settings.cluster_name, address, token_ref)
                    for refused in register_from_settings(
                        session, self.settings.clusters, self.settings.cluster_token_dir
                    ):
                        log.error("%s", refused)
                return
            except IntegrityError:
                if last_try:
                    raise

    def _default_cluster_address(self) -> tuple[str, str | None]:
        """The service's own cluster as registered: its dashboard address and where its token is read."""
        from orchestrator.backend.dashboard import token_ref_from_environment

        if self.local_cluster is not None:
            return self.local_cluster.dashboard_url, f"file:{self.local_cluster.token_path}"
        if self.settings.ray_address:
            return self.settings.ray_address, token_ref_from_environment()
        # A backend handed in (tests): its address if it has one.
        return getattr(self._backend, "dashboard_url", "") or "unknown", None

    def _connect_ray(self) -> ClusterBackend:
        from orchestrator.backend.dashboard import token_from_environment
        from orchestrator.backend.local_cluster import LocalRayCluster
        from orchestrator.backend.ray_backend import RayBackend

        if self.settings.ray_address:
            log.info("using the Ray cluster at %s", self.settings.ray_address)
            return RayBackend(self.settings.ray_address, token_from_environment())
        cluster = LocalRayCluster(
            self.settings.var_path,
            gcs_port=self.settings.ray_gcs_port,
            dashboard_port=self.settings.ray_dashboard_port,
            client_port=self.settings.ray_client_port,
            num_cpus=self.settings.ray_num_cpus,
            num_gpus=self.settings.ray_num_gpus,
            serve_haproxy=self.settings.serve_haproxy,
        )
        cluster.start()
        self.local_cluster = cluster
        return RayBackend(cluster.dashboard_url, cluster.token())

    def _bootstrap_keys(self) -> None:
        with self.sessions.begin() as session:
            project = projects_repo.ensure_default_project(session)
            if self.settings.admin_tokens or projects_repo.any_cluster_admin_key(session):
                return
            _, secret = projects_repo.create_api_key(
                session, project.id, Role.ADMIN, name="bootstrap", cluster_wide=True
            )
        # Shown once, like every key: only its hash is stored.
        print(
            "\n" + "=" * 72 + "\nNo admin key existed, so one was created. It is shown only this once:\n\n"
            f"    {secret}\n\nUse it as 'Authorization: Bearer <key>'. Set ORCHESTRATOR_ADMIN_TOKEN to "
            "choose your own.\n" + "=" * 72 + "\n",
            flush=True,
        )


def connect_ray(address: str, token: str | None) -> ClusterBackend:
    """A registered cluster's backend: Ray's Jobs, State and Serve APIs at its dashboard address."""
    from orchestrator.backend.ray_backend import RayBackend

    return RayBackend(address, token)
