"""Creating, changing, rolling back and deleting deployments: the checks, then one transaction each.

Nothing here talks to Serve: each operation commits the deployment's new target (a version, or
DELETED), and the serving reconciler (``orchestrator.loops.serving``) brings Serve in line with
the database. Only ``check_resources`` asks the cluster, for its size, before the transaction starts.

A new version whose replicas ask no more CPUs and GPUs than the deployment holds now (the default: 0 CPUs a
replica) is rolled out at once; one that asks more waits QUEUED, and the scheduler admits it when its
project's quota and the cluster have room (``orchestrator.scheduling.deployments``): the one place that
does the quota arithmetic, for jobs, sweeps and deployments alike.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from orchestrator.admission import asks_nothing, replicas_beyond
from orchestrator.backend import BackendUnavailable, ClusterBackend
from orchestrator.checkpoint_policy import best_first
from orchestrator.db.models import Checkpoint, Deployment, DeploymentState, Job, Sweep
from orchestrator.errors import Conflict
from orchestrator.repositories import code as code_repo
from orchestrator.repositories import deployments as deployments_repo
from orchestrator.repositories import jobs as jobs_repo
from orchestrator.repositories import sweeps as sweeps_repo
from orchestrator.services.submission import SpecRejected
from orchestrator.settings import Settings
from orchestrator.states.deployments import (
    QUEUED_MESSAGE,
    TERMINAL,
    applied_version,
    record_deployment_created,
    set_deployment_state,
)
from orchestrator.states.jobs import TERMINAL as JOB_TERMINAL
from orchestrator.states.sweeps import TRIAL_TERMINAL
from orchestrator_contract import workloads
from orchestrator_contract.checkpoints import MODEL_FILE, SERVE_MODULE_FILE, SHARDED_DIR, shards_only_problem
from orchestrator_contract.deployments import (
    AutoscalingSpec,
    BatchingSpec,
    DeploymentCreate,
    DeploymentPatch,
    ResourcesSpec,
    SourceSpec,
    auth_of,
    max_body_mb_of,
    settings_of,
)
from orchestrator_contract.sweeps import SweepSpec, trial_spec

log = logging.getLogger(__name__)
T = TypeVar("T")

D = DeploymentState


class DeploymentConflict(Conflict):
    """409: the name or route is taken, or the operation does not fit the deployment's state."""


@dataclass(frozen=True)
class ResolvedSource:
    checkpoint_id: int | None
    checkpoint_path: str
    job_id: str | None
    workload: str
    config: dict[str, Any]
    checkpoint: dict[str, Any]  # epoch, step, attempt, metrics
    cluster: str | None = None  # where the run that wrote it ran: its folder is on that cluster's storage


def source_cluster(session: Session, source: SourceSpec, project_scope: str | None) -> str | None:
    """The cluster of the run whose checkpoint ``source`` names, before it is resolved (None: not known yet, or a
    run placed before clusters existed; ``resolve_source`` says what is wrong with a source that names nothing)."""
    if source.trial_id is not None:
        trial = sweeps_repo.get_trial(session, source.trial_id, project_scope)
        sweep = session.get(Sweep, trial.sweep_id) if trial else None
        return sweep.cluster if sweep else None
    if source.checkpoint_id is not None:
        checkpoint = session.get(Checkpoint, source.checkpoint_id)
        job = session.get(Job, checkpoint.job_id) if checkpoint else None
    else:
        job = jobs_repo.get_job(session, source.job_id or "", project_scope)
    return job.cluster if job else None


def reading_storage_of(
    clusters: Mapping[str, ClusterBackend], home: str | None, storage_of: Callable[[str | None], str]
) -> dict[str, ClusterBackend]:
    """Those of ``clusters`` whose runs' storage is the storage of ``home`` (the cluster the checkpoint was written
    on; ``storage_of``: a cluster's storage path): a replica loads the checkpoint from there. 422 when none is."""
    wanted = storage_of(home)
    reading = {name: backend for name, backend in clusters.items() if storage_of(name) == wanted}
    if not reading:
        raise SpecRejected(
            ("source",),
            f"the checkpoint was written on cluster {home or 'default'}, to its storage ({wanted}), which none of "
            f"the clusters this deployment may use reads ({', '.join(clusters)}): deploy it on a cluster with that "
            "storage_root (placement.cluster), or train it again on one of them",
        )
    return reading


def resolve_source(session: Session, source: SourceSpec, project_scope: str | None) -> ResolvedSource:
    """The committed checkpoint a source names, checked usable; SpecRejected (422) says what to fix."""
    if source.trial_id is not None:
        return _resolve_trial(session, source.trial_id, project_scope)
    if source.checkpoint_id is not None:
        checkpoint = session.get(Checkpoint, source.checkpoint_id)
        job = session.get(Job, checkpoint.job_id) if checkpoint else None
        if checkpoint is None or job is None or (project_scope is not None and job.project_id != project_scope):
            raise SpecRejected(
                ("source", "checkpoint_id"),
                f"no checkpoint {source.checkpoint_id} (GET /v1/jobs/{{id}}/checkpoints lists a job's kept ones)",
            )
        loc: tuple[str, ...] = ("source", "checkpoint_id")
    else:
        job = jobs_repo.get_job(session, source.job_id or "", project_scope)
        if job is None:
            raise SpecRejected(("source", "job_id"), f"no job {source.job_id}")
        loc = ("source", "job_id")
        checkpoint = _pick(job, jobs_repo.list_checkpoints(session, job.id), source)
    hook = serve_hook(session, job.project_id, job.spec, loc, f"job {job.id}")
    if hook is None and not workloads.is_servable(job.workload):
        raise SpecRejected(
            loc,
            f"job {job.id} ran workload {job.workload!r}: serving supports {', '.join(workloads.servable_names())} "
            "and custom workloads",
        )
    if job.state not in JOB_TERMINAL:
        raise SpecRejected(
            loc,
            f"job {job.id} is {job.state}: while it trains, Ray Train may still delete its older checkpoints "
            f"(checkpoint.keep = {job.spec.get('checkpoint', {}).get('keep')}); deploy it once it has ended",
        )
    _check_folder(checkpoint.path, loc)
    return ResolvedSource(
        checkpoint_id=checkpoint.id,
        checkpoint_path=checkpoint.path,
        job_id=job.id,
        cluster=job.cluster,
        workload=job.workload,
        config=dict(job.spec.get("config") or {}),
        checkpoint={
            "attempt": checkpoint.attempt,
            "epoch": checkpoint.epoch,
            "step": checkpoint.step,
            "metrics": dict(checkpoint.metrics or {}),
            **({SERVE_HOOK_KEY: hook} if hook else {}),
        },
    )


# A training function's model is served by its own code: the version's checkpoint record names the package.
SERVE_HOOK_KEY = "code"


def serve_hook(
    session: Session, project_id: str, spec: dict[str, Any], loc: tuple[str, ...], what: str
) -> dict[str, str] | None:
    """For a training function's run: its code package (the replica's working_dir), checked to hold
    ``serve.py`` by its file list (the control plane never imports it); None for a workload's run."""
    entrypoint = spec.get("entrypoint")
    if not entrypoint:
        return None
    needs = (
        f"{what} ran the training function {entrypoint}: serving it needs {SERVE_MODULE_FILE} with "
        f"predict(model, payload) in its code, and {MODEL_FILE} (the whole model, torch.save(model) of the "
        "unwrapped module, from rank 0) in its checkpoint"
    )
    code = spec.get("code") or {}
    package = code_repo.get_package(session, project_id, code["id"]) if code.get("id") else None
    if package is None:
        raise SpecRejected(loc, f"{needs}; it has no code package")
    if not any(f.get("path") == SERVE_MODULE_FILE for f in package.files or ()):
        raise SpecRejected(loc, f"{needs}; its code package {code['id']} has no {SERVE_MODULE_FILE}")
    return {"id": code["id"], "entrypoint": entrypoint}


def _resolve_trial(session: Session, trial_id: str, project_scope: str | None) -> ResolvedSource:
    """The trial's best checkpoint that storage still holds, by the sweep's metric (ties: the later epoch,
    ``orchestrator.checkpoint_policy``); the control plane's retention keeps it (``trial_retention``)."""
    loc = ("source", "trial_id")
    trial = sweeps_repo.get_trial(session, trial_id, project_scope)
    if trial is None:
        raise SpecRejected(loc, f"no trial {trial_id} (GET /v1/sweeps/{{id}}/trials lists a sweep's trials)")
    if trial.state not in TRIAL_TERMINAL:
        raise SpecRejected(
            loc,
            f"trial {trial_id} is {trial.state}: while it trains, retention may still replace "
            "its best checkpoint and delete the old one; deploy it once it has ended",
        )
    sweep = session.get(Sweep, trial.sweep_id)
    hook = serve_hook(session, sweep.project_id, sweep.spec.get("base") or {}, loc, f"trial {trial_id}")
    if hook is None and not workloads.is_servable(sweep.workload):
        raise SpecRejected(
            loc,
            f"trial {trial_id} ran workload {sweep.workload!r}: serving supports "
            f"{', '.join(workloads.servable_names())} and custom workloads",
        )
    sweep_spec = SweepSpec.model_validate(sweep.spec)
    points = sweeps_repo.trial_checkpoints(session, trial.id)
    ranked = best_first(
        points, sweep_spec.metric, sweep_spec.mode or "max", metrics=lambda p: p.values, order=lambda p: p.epoch
    )
    point = _first_usable(
        ranked, lambda p: p.checkpoint_path, loc, f"trial {trial_id} ({trial.state}) has no checkpoint left to deploy"
    )
    spec = trial_spec(sweep_spec.base, trial.config)
    return ResolvedSource(
        checkpoint_id=None,
        checkpoint_path=point.checkpoint_path,
        job_id=None,
        cluster=sweep.cluster,
        workload=sweep.workload,
        config=dict(spec.config),
        checkpoint={
            "attempt": 1,
            "epoch": point.epoch,
            "step": point.step,
            "metrics": dict(point.values),
            "sweep_id": sweep.id,
            "trial_id": trial.id,
            **({SERVE_HOOK_KEY: hook} if hook else {}),
        },
    )


def _pick(job: Job, checkpoints: list[Checkpoint], source: SourceSpec) -> Checkpoint:
    """The job's best (ties: the newer, ``orchestrator.checkpoint_policy``) or latest checkpoint whose
    folder still holds a model; if it doesn't, the next one."""
    newest_first = sorted(checkpoints, key=lambda c: c.id, reverse=True)
    candidates = newest_first
    if source.select != "latest":
        metric, higher_is_better = selection_metric(job, source)
        ranked = best_first(
            checkpoints, metric, "max" if higher_is_better else "min", metrics=lambda c: c.metrics, order=lambda c: c.id
        )
        carried = {name for c in checkpoints for name in (c.metrics or {})}
        if not ranked and carried:  # e.g. a regression workload's: best by val_accuracy would mean latest
            raise SpecRejected(
                ("source", "metric"),
                f"no checkpoint of job {job.id} carries {metric!r} (they carry {sorted(carried)}): give "
                "source.metric (and mode), or select: latest",
            )
        candidates = ranked + [c for c in newest_first if c not in ranked]  # unscored ones: newest first
    return _first_usable(
        candidates,
        lambda c: c.path,
        ("source", "job_id"),
        f"job {job.id} ({job.state}) has no committed checkpoint to deploy",
    )


def _first_usable(candidates: list[T], path_of: Callable[[T], str], loc: tuple[str, ...], none_left: str) -> T:
    """The first candidate whose checkpoint folder holds a model; SpecRejected when none does."""
    problems = []
    for candidate in candidates:
        try:
            _check_folder(path_of(candidate), loc)
            return candidate
        except SpecRejected as exc:
            problems.append(str(exc))
    raise SpecRejected(loc, none_left + (f" ({'; '.join(problems[:3])})" if problems else ""))


def selection_metric(job: Job, source: SourceSpec | None = None) -> tuple[str, bool]:
    """The metric "best" means, and whether higher is better: the source's ``metric``, else the job's own
    ``checkpoint.keep_best`` when it set one, else its workload's. A training function has no default."""
    if source is not None and source.metric:
        return source.metric, source.mode != "min"
    keep_best = (job.spec.get("checkpoint") or {}).get("keep_best") or {}
    if keep_best.get("metric"):
        return keep_best["metric"], keep_best.get("mode", "max") != "min"
    if job.spec.get("entrypoint"):
        raise SpecRejected(
            ("source", "metric"),
            f'job {job.id} ran a training function: the metrics its checkpoints carry are its own, so "best" '
            "needs one: give source.metric (and mode), or select: latest",
        )
    return workloads.selection_of(job.workload)  # the registry's: val_accuracy for every workload today


def _check_folder(path: str, loc: tuple[str, ...]) -> None:
    """A local checkpoint folder must still hold a model a replica loads: ``model.pt`` (tensors only; one with
    only FSDP shards is refused, saying how to make it servable). URIs are checked by the replica that loads
    them."""
    if "://" in path:
        return
    folder = Path(path)
    if not folder.is_dir():
        raise SpecRejected(loc, f"the checkpoint folder {path} no longer exists")
    if not (folder / MODEL_FILE).is_file():
        if (folder / SHARDED_DIR).is_dir():
            raise SpecRejected(loc, shards_only_problem(path))
        raise SpecRejected(loc, f"the checkpoint folder {path} holds no model ({MODEL_FILE})")


def check_resources(resources: dict[str, float], backend: ClusterBackend, replicas: int | dict[str, Any] = 1) -> None:
    """A replica larger than the cluster's largest node would wait forever, and so would replicas (at most
    ``replicas``: a count, or autoscaling's ``max``) that together ask more than the whole cluster holds
    (docs/security.md, hole 7): 422 now instead, saying what fits."""
    try:
        capacity = backend.capacity()
    except BackendUnavailable as exc:
        log.warning("could not check cluster capacity for a deployment: %s", exc)
        return  # a rollout that never becomes healthy times out with a reason
    for key, resource in (("cpus", "CPU"), ("gpus", "GPU")):
        largest = capacity.largest_node.get(resource, 0.0)
        if resources[key] > largest + 1e-9:
            raise SpecRejected(
                ("resources", key),
                f"each replica needs {resources[key]:g} {resource} but the largest node has {largest:g} {resource}",
            )
    most = replicas if isinstance(replicas, int) else int(replicas["max"])
    for key, resource in (("cpus", "CPU"), ("gpus", "GPU")):
        total = capacity.total.get(resource, 0.0)
        if resources[key] > 0 and most * resources[key] > total + 1e-9:
            fit = int((total + 1e-9) // resources[key])
            raise SpecRejected(
                ("replicas",),
                f"{most} replicas x {resources[key]:g} {resource} is more than the cluster's {total:g} {resource} in "
                f"all: at most {fit} replicas of this size fit",
            )


def serving_cluster(clusters: Mapping[str, ClusterBackend], serving: dict[str, Any]) -> str:
    """The cluster a new deployment serves on, among those it may use: one its replicas fit (``check_resources``),
    the one with the most GPUs then CPUs. Raises the first cluster's SpecRejected when they fit none."""
    fitting: list[tuple[tuple[float, float], str]] = []
    refusal: SpecRejected | None = None
    for name, backend in clusters.items():
        try:
            check_resources(serving["resources"], backend, serving["replicas"])
        except SpecRejected as exc:
            refusal = refusal or exc
            continue
        try:
            total = backend.capacity().total
        except BackendUnavailable:
            total = {}
        fitting.append(((total.get("GPU", 0.0), total.get("CPU", 0.0)), name))
    if not fitting:
        assert refusal is not None
        raise refusal
    return max(fitting)[1]


def new_settings(body: DeploymentCreate, settings: Settings) -> dict[str, Any]:
    return settings_of(
        body.replicas, body.batching, body.resources, settings.serve_replica_cpus, body.auth, body.max_body_mb
    )


def patched_settings(current: dict[str, Any], patch: DeploymentPatch, settings: Settings) -> dict[str, Any]:
    """The current version's settings with what the patch gives; ``batching: null`` turns batching off."""
    given = patch.model_fields_set
    replicas = patch.replicas if "replicas" in given and patch.replicas is not None else _replicas_of(current)
    if "batching" in given:
        batching = patch.batching
    else:
        batching = BatchingSpec.model_validate(current["batching"])
    resources = (
        patch.resources
        if "resources" in given and patch.resources is not None
        else (ResourcesSpec.model_validate(current["resources"]))
    )
    auth = patch.auth if "auth" in given and patch.auth is not None else auth_of(current)
    max_body_mb = (
        patch.max_body_mb if "max_body_mb" in given and patch.max_body_mb is not None else (max_body_mb_of(current))
    )
    return settings_of(replicas, batching, resources, settings.serve_replica_cpus, auth, max_body_mb)


def _replicas_of(current: dict[str, Any]) -> int | AutoscalingSpec:
    replicas = current["replicas"]
    return replicas if isinstance(replicas, int) else AutoscalingSpec.model_validate(replicas)


def create_deployment(
    session: Session,
    project_id: str,
    body: DeploymentCreate,
    resolved: ResolvedSource,
    settings: dict[str, Any],
    idempotency_key: str | None = None,
    request_digest: str = "",
) -> Deployment:
    """Store a new deployment with its version 1: DEPLOYING, or QUEUED when its replicas hold CPUs or GPUs (the
    scheduler admits it). DeploymentConflict for a taken name or route."""
    assert body.route_prefix is not None  # filled in by the spec
    if deployments_repo.find_live(session, body.name) is not None:
        raise DeploymentConflict(f"a deployment named {body.name!r} already exists; choose another name or delete it")
    if (holder := deployments_repo.route_taken(session, body.route_prefix)) is not None:
        # Another project's deployment is not named (nor its project): the caller only learns the route is taken.
        owner = f"deployment {holder.name!r}" if holder.project_id == project_id else "another project's deployment"
        raise DeploymentConflict(f"route_prefix {body.route_prefix} is taken by {owner}; choose another route_prefix")
    try:
        with session.begin_nested():
            state = D.DEPLOYING if asks_nothing(replicas_beyond(settings, None).total) else D.QUEUED
            deployment = deployments_repo.create_deployment(
                session, project_id, body.name, resolved.workload, body.route_prefix, state
            )
            deployment.idempotency_key = idempotency_key
            deployment.request_digest = request_digest
            _add_version(session, deployment, resolved, body.source, settings, "")
            record_deployment_created(session, deployment, f"version 1 from {_describe(resolved)}")
    except IntegrityError:
        # A concurrent create won the name or the route (the partial unique indexes).
        raise DeploymentConflict(
            f"a deployment named {body.name!r} or routed at {body.route_prefix} already exists"
        ) from None
    return deployment


def update_deployment(
    session: Session,
    deployment: Deployment,
    resolved: ResolvedSource | None,
    source: SourceSpec | None,
    settings: dict[str, Any],
    note: str = "",
) -> Deployment:
    """A new version (new checkpoint and/or settings) as the target; the deployment must be locked."""
    if deployment.state in TERMINAL:
        raise DeploymentConflict(f"deployment {deployment.name} was deleted")
    current = deployment.get_version(deployment.version)
    assert current is not None
    if resolved is None:  # settings only: the same checkpoint
        resolved = ResolvedSource(
            checkpoint_id=current.checkpoint_id,
            checkpoint_path=current.checkpoint_path,
            job_id=current.job_id,
            workload=deployment.workload,
            config=current.config,
            checkpoint=current.checkpoint,
        )
        source_json = current.source
    else:
        source_json = source.model_dump(exclude_none=True) if source else {}
    if resolved.workload != deployment.workload:
        raise SpecRejected(
            ("source",),
            f"deployment {deployment.name} serves {deployment.workload}; that checkpoint is from a "
            f"{resolved.workload} job (create a new deployment for it)",
        )
    what = f"version {deployment.version + 1} from {_describe(resolved)}"
    return _retarget(session, deployment, resolved, source_json, settings, note, "new_version", what)


def rollback_deployment(session: Session, deployment: Deployment) -> Deployment:
    """Back to the version before the newest: a new version with that one's checkpoint and settings."""
    if deployment.state in TERMINAL:
        raise DeploymentConflict(f"deployment {deployment.name} was deleted")
    if deployment.version < 2:
        raise DeploymentConflict(f"deployment {deployment.name} has only version 1: there is nothing to roll back to")
    previous = deployment.get_version(deployment.version - 1)
    assert previous is not None
    _check_folder(previous.checkpoint_path, ("source",))
    resolved = ResolvedSource(
        checkpoint_id=previous.checkpoint_id,
        checkpoint_path=previous.checkpoint_path,
        job_id=previous.job_id,
        workload=deployment.workload,
        config=previous.config,
        checkpoint=previous.checkpoint,
    )
    note = f"rollback to version {previous.version}"
    what = f"version {deployment.version + 1} ({note})"
    # Who may call it and the body cap are not rolled back: a rollback never reopens a deployment.
    current = deployment.get_version(deployment.version)
    assert current is not None
    settings = {**previous.settings, "auth": auth_of(current.settings), "max_body_mb": max_body_mb_of(current.settings)}
    return _retarget(session, deployment, resolved, previous.source, settings, note, "rollback", what)


def _retarget(
    session: Session,
    deployment: Deployment,
    resolved: ResolvedSource,
    source: dict[str, Any],
    settings: dict[str, Any],
    note: str,
    reason: str,
    what: str,
) -> Deployment:
    """Append the version and start rolling it out: UPDATING while an old version serves, else DEPLOYING; or
    QUEUED, the old version serving meanwhile, when its replicas ask more than the deployment holds now."""
    serving = applied_version(deployment)
    extra = replicas_beyond(settings, serving.settings if serving is not None else None)
    _add_version(session, deployment, resolved, source, settings, note)
    if asks_nothing(extra.total):
        start_rollout(session, deployment, reason, what)
    else:
        keeps = f"; version {deployment.live_version} keeps serving" if deployment.live_version is not None else ""
        message = f"queued {what}: {QUEUED_MESSAGE}{keeps}"
        set_deployment_state(session, deployment, D.QUEUED, reason, message, again=True)
    return deployment  # the move forgot any failed version (orchestrator.states.deployments)


def start_rollout(session: Session, deployment: Deployment, reason: str, what: str) -> None:
    """Roll the newest version out: UPDATING while an old version serves, else DEPLOYING. The deployment must
    be locked."""
    if deployment.live_version is None:
        set_deployment_state(session, deployment, D.DEPLOYING, reason, f"deploying {what}", again=True)
    else:
        set_deployment_state(
            session,
            deployment,
            D.UPDATING,
            reason,
            f"rolling out {what}; version {deployment.live_version} serves until it is healthy",
            again=True,
        )


def delete_deployment(session: Session, deployment: Deployment) -> Deployment:
    """DELETED at once; the reconciler removes the Serve application, and with it the route."""
    if deployment.state in TERMINAL:
        raise DeploymentConflict(f"deployment {deployment.name} was already deleted")
    set_deployment_state(
        session, deployment, D.DELETED, "deleted", "deleted at the user's request; its route is removed"
    )
    return deployment


def _add_version(
    session: Session,
    deployment: Deployment,
    resolved: ResolvedSource,
    source: SourceSpec | dict[str, Any],
    settings: dict[str, Any],
    note: str,
) -> None:
    deployments_repo.add_version(
        session,
        deployment,
        checkpoint_id=resolved.checkpoint_id,
        checkpoint_path=resolved.checkpoint_path,
        job_id=resolved.job_id,
        checkpoint=resolved.checkpoint,
        config=resolved.config,
        source=source.model_dump(exclude_none=True) if isinstance(source, SourceSpec) else dict(source),
        settings=settings,
        note=note,
    )


def _describe(resolved: ResolvedSource) -> str:
    epoch = resolved.checkpoint.get("epoch")
    if resolved.checkpoint.get("trial_id"):  # a trial's checkpoint has no checkpoint row (nor id)
        return f"trial {resolved.checkpoint['trial_id']} of sweep {resolved.checkpoint.get('sweep_id')} (epoch {epoch})"
    where = f"job {resolved.job_id} " if resolved.job_id else ""
    return f"{where}checkpoint {resolved.checkpoint_id} (epoch {epoch})"
