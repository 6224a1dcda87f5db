"""Brings Ray Serve in line with the database, declaratively, the way KubeRay's RayService does.

Every tick builds, for each cluster, ONE multi-application Serve config from the live deployments placed there (a
PUT replaces Serve's whole set of applications, so the database, not Serve, is the source of truth),
compares it with what Serve reports (``GET /api/serve/applications/``: each application's config as
submitted, its status, its replicas), and sends it only when they differ. That same comparison
restores every deployment after a Ray restart (Serve reports nothing) and adopts a running Serve
after a control-plane restart (Serve reports exactly the config: nothing to do).

A QUEUED deployment (its newest version waits for the scheduler: ``orchestrator.scheduling.deployments``)
contributes the version that keeps serving, if any (``applied_version``), and is left in its state.

Then each deployment's state follows what Serve reports about the version it should run:

- a rollout (DEPLOYING, UPDATING) is promoted to HEALTHY only when Serve reports the application
  RUNNING with the config of the new version (its number travels in ``user_config``), that is, every
  replica of the new version passed its health check;
- a rollout that Serve reports DEPLOY_FAILED or UNHEALTHY, or that is not healthy within
  ``serve_rollout_timeout_s``, is not promoted: the deployment goes UNHEALTHY with the reason, the
  version is marked failed, and the next config carries the previous version again, whose replicas
  never stopped (rollouts surge: new replicas start before old ones stop). A first version that fails
  has nothing to fall back to: FAILED;
- a HEALTHY deployment whose application Serve reports unhealthy or missing goes UNHEALTHY, and back
  to HEALTHY once Serve runs it again.

Ray is asked without holding any row lock; a decision is applied under the row's lock only if the
row is still what the decision was made from.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session, sessionmaker

from orchestrator.backend import BackendUnavailable, ClusterBackend, ServeApp, ServeConfigRejected, ServeStatus
from orchestrator.backend.registry import ClusterBackends, backends_of
from orchestrator.db.models import ApiKey, Deployment, DeploymentState, DeploymentVersion, utcnow
from orchestrator.repositories import clusters as clusters_repo
from orchestrator.repositories import deployments as deployments_repo
from orchestrator.request_context import log_context
from orchestrator.services.deployments import SERVE_HOOK_KEY
from orchestrator.services.launch import CodeMount, package_mount
from orchestrator.settings import Settings
from orchestrator.states.deployments import ROLLING, applied_version, lock_deployment, set_deployment_state
from orchestrator_contract.deployments import SERVE_APP_IMPORT_PATH, SERVE_DEPLOYMENT_NAME, auth_of, max_body_mb_of

log = logging.getLogger(__name__)

D = DeploymentState
HEALTH_CHECK_PERIOD_S = 5.0
FAILED_STATUSES = ("DEPLOY_FAILED", "UNHEALTHY")


# --- the Serve config -----------------------------------------------------------------------------


def max_ongoing_requests(max_batch_size: int) -> int:
    """Requests a replica accepts at once: at least 64, and twice the batch, so a replica fills its next
    batch while one runs. A replica at its limit makes Serve's router back off and retry, and
    throughput collapses (RAY-NOTES: 11 req/s at concurrency 32 at Serve's default of 5; measured
    here: 12 req/s unbatched at 8, 97 at 64); past the limit requests simply queue in the replica."""
    return max(64, 2 * max_batch_size)


# Serve's per-request access log lines cost the proxy and the replica CPU on every request (bench/serve.py);
# errors and replica output are still logged.
LOGGING = {"enable_access_log": False}


def project_key_hashes(session: Session, project_ids: set[str]) -> dict[str, list[str]]:
    """Each project's currently valid keys, as the SHA-256 hex digests the database stores (never a key):
    not expired, made for the project (the cluster-wide bootstrap key is not a model's client key).
    A revoked key's row is gone, so its hash leaves the next config the reconciler builds."""
    if not project_ids:
        return {}
    now = utcnow()
    rows = session.execute(
        select(ApiKey.project_id, ApiKey.key_hash).where(
            ApiKey.project_id.in_(project_ids),
            ApiKey.cluster_wide.is_(False),
            or_(ApiKey.expires_at.is_(None), ApiKey.expires_at > now),
        )
    ).all()
    hashes: dict[str, list[str]] = {project_id: [] for project_id in project_ids}
    for project_id, key_hash in rows:
        hashes[project_id].append(key_hash)
    return {project_id: sorted(found) for project_id, found in hashes.items()}


def app_config(
    deployment: Deployment,
    version: DeploymentVersion,
    key_hashes: list[str] | None = None,
    code: CodeMount | None = None,
) -> dict[str, Any]:
    """One Serve application: ``args`` (the model: a change restarts replicas, rolled) and the
    deployment options, with version, batching, threads, auth and the body cap in ``user_config``
    (applied in place: a key revoked or added reaches running replicas without a restart).

    ``key_hashes``: the project's valid keys' SHA-256 digests (``project_key_hashes``); only a deployment
    with ``auth: project`` is sent them."""
    settings = version.settings
    auth = auth_of(settings)
    batching, resources, replicas = settings["batching"], settings["resources"], settings["replicas"]
    options: dict[str, Any] = {
        "name": SERVE_DEPLOYMENT_NAME,
        "max_ongoing_requests": max_ongoing_requests(batching["max_batch_size"]),
        "ray_actor_options": {"num_cpus": resources["cpus"], "num_gpus": resources["gpus"]},
        "user_config": {
            "version": version.version,
            "max_batch_size": batching["max_batch_size"],
            "batch_wait_timeout_s": batching["wait_ms"] / 1000,
            "threads": max(1, int(resources["cpus"])),
            "auth": auth,
            "key_hashes": sorted(key_hashes or []) if auth == "project" else [],
            "max_body_mb": max_body_mb_of(settings),
        },
        # Replacements start before old replicas stop, and a failed rollout leaves the old ones serving.
        "max_surge_percent": 100,
        "health_check_period_s": HEALTH_CHECK_PERIOD_S,
    }
    if isinstance(replicas, int):
        options["num_replicas"] = replicas
    else:
        options["autoscaling_config"] = {
            "min_replicas": replicas["min"],
            "max_replicas": replicas["max"],
            "target_ongoing_requests": replicas["target_ongoing_requests"],
        }
    app = {
        "name": deployment.name,
        "route_prefix": deployment.route_prefix,
        "import_path": SERVE_APP_IMPORT_PATH,
        "logging_config": LOGGING,
        "args": {
            "checkpoint_path": version.checkpoint_path,
            "workload": deployment.workload,
            "config": version.config,
            "deployment": deployment.name,
        },
        "deployments": [options],
    }
    if code is not None:
        # A training function's model: loaded from model.pt and answered by its code's serve.py, which the
        # replica imports from the run's own package (the same gcs:// URI the run had as its working_dir).
        app["args"]["serve_hook"] = True
        app["runtime_env"] = {"working_dir": code.uri}
    return app


def serve_config(settings: Settings, applications: list[dict[str, Any]], port: int | None = None) -> dict[str, Any]:
    """The whole Serve config of one cluster; ``port``: its proxy's (the cluster's ``serve_port``; None:
    ORCHESTRATOR_SERVE_PORT)."""
    return {
        "http_options": {"host": settings.serve_host, "port": port or settings.serve_port},
        "logging_config": LOGGING,
        "applications": applications,
    }


def matches(desired: Any, deployed: Any) -> bool:
    """Serve hands back a submitted config as sent, with numbers maybe as floats and possibly extra
    keys: every key we set must be there with an equal value."""
    if isinstance(desired, dict):
        return isinstance(deployed, dict) and all(matches(v, deployed.get(k)) for k, v in desired.items())
    if isinstance(desired, list):
        return (
            isinstance(deployed, list)
            and len(desired) == len(deployed)
            and all(matches(a, b) for a, b in zip(desired, deployed, strict=True))
        )
    if isinstance(desired, bool) or isinstance(deployed, bool):
        return desired is deployed
    if isinstance(desired, (int, float)):
        return isinstance(deployed, (int, float)) and float(desired) == float(deployed)
    return desired == deployed


def needs_apply(desired: dict[str, dict], status: ServeStatus) -> bool:
    present = {name: app for name, app in status.apps.items() if app.status != "DELETING"}
    if set(present) != set(desired):
        return True
    return any(not matches(config, present[name].config) for name, config in desired.items())


# --- the reconciler ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Snapshot:
    id: str
    name: str
    state: DeploymentState
    version: int
    live_version: int | None
    failed_version: int | None
    rollout_started_at: datetime | None
    observed: dict | None
    applied: int | None  # the version number Serve should run
    config: dict | None  # its application config
    code: CodeMount | None = None  # a served training function's package
    cluster: str | None = None  # where it serves; None: the default cluster
    url: str = ""  # where callers reach it (its cluster's Serve), for the messages


@dataclass(frozen=True)
class _Decision:
    to_state: DeploymentState | None = None
    reason: str = ""
    message: str = ""


class ServingReconciler:
    def __init__(self, sessions: sessionmaker[Session], backends: ClusterBackends | ClusterBackend, settings: Settings):
        self.sessions = sessions
        self.backends = backends_of(backends, sessions, settings.cluster_name)
        self.settings = settings
        self.last_apply_error: str | None = None

    def tick(self) -> None:
        with self.sessions() as session:
            if not deployments_repo.any_deployment(session):
                return  # nothing was ever deployed: don't even ask Serve
            live = deployments_repo.live_deployments(session)
            hashes = project_key_hashes(session, {d.project_id for d in live})
            urls = clusters_repo.serve_urls(session, self.settings.serve_url, self.settings.serve_port)
            snapshots = [self._snapshot(session, d, hashes.get(d.project_id, []), urls) for d in live]
            # Every cluster, not only those serving now: one whose last deployment went has apps to remove.
            entries = self.backends.refresh(session)
        default = self.backends.default_name
        # The default cluster's Serve listens on ORCHESTRATOR_SERVE_PORT; another on its serve_port, if it has one.
        ports = {e.name: e.serve_port for e in entries if e.name != default} | {default: None}
        for cluster in sorted(ports):  # each cluster's Serve holds its own deployments only (docs/clusters.md)
            self._tick_cluster(cluster, [s for s in snapshots if (s.cluster or default) == cluster], ports[cluster])

    def _tick_cluster(self, cluster: str, snapshots: list[_Snapshot], port: int | None) -> None:
        try:
            backend = self.backends.get(cluster)
            status = backend.serve_status()
        except BackendUnavailable as exc:
            log.warning("serving: cluster %s unreachable, will retry: %s", cluster, exc)
            return
        desired = {s.name: s.config for s in snapshots if s.config is not None}
        if needs_apply(desired, status):
            try:  # Ray drops a package no job uses any more: a served function's goes back first
                for mount in {s.code for s in snapshots if s.code is not None}:
                    mount.upload(backend, self.settings)
            except BackendUnavailable as exc:
                log.warning("serving: uploading a served function's code failed, will retry: %s", exc)
                return
            self._apply(backend, list(desired.values()), port)
        if status.http_port is not None and status.http_port != (port or self.settings.serve_port):
            log.warning(
                "Ray Serve of cluster %s already listens on port %s, not %s (its serve_port, else "
                "ORCHESTRATOR_SERVE_PORT): Serve keeps the port it started with until it is shut down",
                cluster,
                status.http_port,
                port or self.settings.serve_port,
            )
        for snapshot in snapshots:
            with log_context(deployment=snapshot.name):  # log lines name the deployment
                self._reconcile(snapshot, status.apps.get(snapshot.name))

    def _snapshot(
        self, session: Session, deployment: Deployment, key_hashes: list[str], urls: dict[str | None, str]
    ) -> _Snapshot:
        version = applied_version(deployment)
        hook = (version.checkpoint or {}).get(SERVE_HOOK_KEY) if version else None
        code = package_mount(session, deployment.project_id, hook) if hook else None
        return _Snapshot(
            id=deployment.id,
            name=deployment.name,
            state=deployment.state,
            version=deployment.version,
            live_version=deployment.live_version,
            failed_version=deployment.failed_version,
            rollout_started_at=deployment.rollout_started_at,
            observed=deployment.observed,
            applied=version.version if version else None,
            config=app_config(deployment, version, key_hashes, code) if version else None,
            code=code,
            cluster=deployment.cluster,
            url=f"{urls.get(deployment.cluster, urls[None])}{deployment.route_prefix}",
        )

    def _apply(self, backend: ClusterBackend, applications: list[dict], port: int | None) -> None:
        names = ", ".join(app["name"] for app in applications) or "none"
        try:
            backend.apply_serve(serve_config(self.settings, applications, port))
            log.info("serving: applied the Serve config (applications: %s)", names)
            self.last_apply_error = None
        except ServeConfigRejected as exc:
            self.last_apply_error = f"Serve refused the config: {exc}"
            log.error("serving: %s", self.last_apply_error)
        except BackendUnavailable as exc:
            self.last_apply_error = str(exc)
            log.warning("serving: applying the config failed, will retry: %s", exc)

    def _reconcile(self, snapshot: _Snapshot, app: ServeApp | None) -> None:
        decision = self._decide(snapshot, app)
        observed = _observed(app, snapshot.applied)
        changed_observation = _without_time(observed) != _without_time(snapshot.observed)
        if decision is None and not changed_observation:
            return
        with self.sessions.begin() as session:
            deployment = lock_deployment(session, snapshot.id)
            if deployment is None or (
                deployment.state,
                deployment.version,
                deployment.live_version,
                deployment.failed_version,
            ) != (snapshot.state, snapshot.version, snapshot.live_version, snapshot.failed_version):
                return  # changed since we looked: decide again next tick
            if changed_observation:
                deployment.observed = observed
            if decision is None:
                return
            # The version pointers follow the transition (orchestrator.states.deployments): a rollout that
            # ends HEALTHY promotes its version, one that ends FAILED or UNHEALTHY marks it failed.
            if decision.to_state is not None:
                set_deployment_state(session, deployment, decision.to_state, decision.reason, decision.message)
        if decision.to_state is not None:
            log.info("deployment %s: %s (%s)", snapshot.name, decision.to_state, decision.reason)

    def _decide(self, s: _Snapshot, app: ServeApp | None) -> _Decision | None:
        if s.applied is None or s.config is None:
            return None  # FAILED: nothing to serve until a new version
        runs_it = app is not None and matches(s.config, app.config)
        url = s.url
        if s.state in ROLLING and s.applied == s.version:
            if runs_it and app is not None and app.status == "RUNNING":
                reason = "deployed" if s.state == D.DEPLOYING else "updated"
                return _Decision(D.HEALTHY, reason, f"version {s.version} serves at {url}")
            if runs_it and app is not None and app.status in FAILED_STATUSES:
                return self._fail_rollout(s, "health_check_failed", f"Serve reports {app.status}: {_why(app)}")
            timeout = timedelta(seconds=self.settings.serve_rollout_timeout_s)
            if s.rollout_started_at is not None and utcnow() - s.rollout_started_at > timeout:
                seen = f"Serve reports {app.status}: {_why(app)}" if app else "Serve has no such application"
                if self.last_apply_error:
                    seen += f"; the last config was not applied: {self.last_apply_error}"
                return self._fail_rollout(
                    s, "rollout_timeout", f"not healthy within {self.settings.serve_rollout_timeout_s:g} s ({seen})"
                )
            return None
        if s.state == D.HEALTHY:
            if app is None:
                return _Decision(
                    D.UNHEALTHY,
                    "app_missing",
                    f"Ray Serve has no application {s.name} (was Ray restarted?): its config is being applied again",
                )
            if runs_it and app.status in FAILED_STATUSES:
                return _Decision(D.UNHEALTHY, "replicas_unhealthy", f"Serve reports {app.status}: {_why(app)}")
            return None
        if s.state == D.UNHEALTHY and s.failed_version is None:
            if runs_it and app is not None and app.status == "RUNNING":
                return _Decision(D.HEALTHY, "recovered", f"version {s.applied} serves at {url} again")
        return None  # UNHEALTHY after a failed rollout: the old version serves until a new one is asked for

    def _fail_rollout(self, s: _Snapshot, reason: str, why: str) -> _Decision:
        if s.live_version is None:
            return _Decision(D.FAILED, reason, f"version {s.version} failed: {why}")
        return _Decision(
            D.UNHEALTHY,
            reason,
            f"version {s.version} was not promoted: {why}. Version {s.live_version} keeps serving",
        )


def _why(app: ServeApp) -> str:
    parts = [app.message.strip(), app.deployment_message.strip()]
    return " ".join(p for p in parts if p)[-3000:] or "no message"


def _observed(app: ServeApp | None, applied: int | None) -> dict[str, Any]:
    if app is None:
        return {"status": "MISSING", "message": "", "replicas": [], "observed_at": utcnow().isoformat()}
    version = ((app.config or {}).get("deployments") or [{}])[0].get("user_config", {}).get("version")
    return {
        "status": app.status,
        "message": _why(app) if app.status != "RUNNING" else "",
        "version": version,
        "target_replicas": app.target_replicas,
        "replicas": [{"replica_id": r.replica_id, "state": r.state} for r in app.replicas],
        "observed_at": utcnow().isoformat(),
    }


def _without_time(observed: dict | None) -> dict | None:
    if observed is None:
        return None
    return {k: v for k, v in observed.items() if k != "observed_at"}
