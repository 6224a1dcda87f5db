"""Accepting a job or a sweep: the checks that need the server's settings or the cluster (``orchestrator.use_cases``
runs them, in order, before the insert)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from sqlalchemy.orm import Session

from orchestrator.admission import Demand, never_fits, sweep_demand
from orchestrator.backend import BackendUnavailable, ClusterBackend
from orchestrator.data_paths import DataPathRefused, data_files, resolve_data_path
from orchestrator.errors import Invalid
from orchestrator.planner import DoesNotFit, plan_job
from orchestrator.repositories import code as code_repo
from orchestrator.settings import Settings
from orchestrator_contract.code import CodeSpec
from orchestrator_contract.jobs import JobSpec, TrainingPlan, is_custom_workload, metric_never_reported
from orchestrator_contract.sweeps import Choice, Grid, SweepSpec, trial_spec

log = logging.getLogger(__name__)


class SpecRejected(Invalid):
    """A spec that parses but can't run here; ``loc`` names the field like pydantic does."""

    def __init__(self, loc: tuple[str, ...], message: str):
        super().__init__(message, loc)


def pin_data_paths(spec: JobSpec, settings: Settings) -> JobSpec:
    """The spec with every data file its workload's config names (``orchestrator.data_paths.data_files``)
    checked against the data roots and replaced by its resolved path (``orchestrator.data_paths``)."""
    files = data_files(spec)
    if not files:
        return spec
    config = dict(spec.config)
    for (_, name), given in files.items():
        config[name] = _pinned(given, settings, ("config", name))
    return spec.model_copy(update={"config": config})


def pin_sweep_data_paths(spec: SweepSpec, settings: Settings) -> SweepSpec:
    """Every value a search may give a trial, checked and pinned as a job's data files are: the value is put
    in the base as a trial gets it, so a data path anywhere in it (``config.text_path``, or a whole
    ``config`` dict holding one) is found by the job's own check. Ranges give numbers only."""
    space = dict(spec.search_space)
    for path, dim in spec.search_space.items():
        if isinstance(dim, (Choice, Grid)):
            values = [_pinned_trial_value(spec.base, path, value, settings) for value in dim.values]
            space[path] = dim.model_copy(update={"values": values})
    return spec.model_copy(update={"search_space": space})


def _pinned_trial_value(base: JobSpec, path: str, value: Any, settings: Settings) -> Any:
    """``value`` with each data file the trial it makes names inside it replaced by its resolved path."""
    prefix = tuple(path.split("."))
    for where, given in data_files(trial_spec(base, {path: value})).items():
        if where[: len(prefix)] == prefix:  # the file comes from this value, not from the (pinned) base
            pinned = _pinned(given, settings, ("search_space", path, "values"))
            value = _replaced(value, where[len(prefix) :], pinned)
    return value


def _replaced(value: Any, where: tuple[str, ...], new: str) -> Any:
    if not where:
        return new
    copy = dict(value)
    copy[where[0]] = _replaced(copy.get(where[0], {}), where[1:], new)
    return copy


def _pinned(value: str, settings: Settings, loc: tuple[str, ...]) -> str:
    try:
        return resolve_data_path(value, settings.data_root_paths, int(settings.data_max_mb * 1024 * 1024))
    except DataPathRefused as exc:
        raise SpecRejected(loc, str(exc)) from None


def check_runnable(spec: JobSpec, settings: Settings, clusters: Mapping[str, ClusterBackend]) -> TrainingPlan:
    """Everything about a spec that pydantic alone can't judge; returns the plan the job will run with.
    ``clusters``: those it may be placed on (``services.placement.clusters_for``); it must fit one of them."""
    # A custom workload and a training function alike: "module:function" with code comes from the job's own
    # package (run on the cluster, never imported here); without, only from a package the operator installed
    # and allowed.
    for field, ref in (("workload", spec.workload), ("entrypoint", spec.entrypoint)):
        if ref is not None and is_custom_workload(ref) and spec.code is None:
            package = ref.split(":")[0].split(".")[0]
            allowed = settings.allowed_workload_packages
            if package not in allowed:
                allowed_text = ", ".join(sorted(allowed)) or "none are allowed (set ORCHESTRATOR_WORKLOAD_PACKAGES)"
                raise SpecRejected(
                    (field,),
                    f"package {package!r} is not an allowed workload package: {allowed_text}"
                    + (" (or send the function's code with the job: `code`)" if field == "entrypoint" else ""),
                )
    keep_best = spec.checkpoint.keep_best
    if keep_best is not None:
        problem = metric_never_reported(spec.workload, keep_best.metric, settings.max_metric_name_chars)
        if problem:
            raise SpecRejected(("checkpoint", "keep_best", "metric"), problem)
    try:
        plan = plan_job(spec)
    except DoesNotFit as exc:
        raise SpecRejected(("strategy",), f"the model does not fit the workers' memory: {exc}") from None
    reason = _never_fits_now(spec, clusters)
    if reason:
        raise SpecRejected(("scaling",), f"this job can never run on {_which(clusters)}: {reason}")
    return plan


def check_code(
    session: Session, project_id: str, code: CodeSpec | None, settings: Settings, loc: tuple[str, ...] = ()
) -> None:
    """The job's code package exists in its project, and its requirements are allowed here."""
    if code is None:
        return
    if code_repo.get_package(session, project_id, code.id) is None:
        raise SpecRejected(
            (*loc, "code", "id"), f"no code package {code.id} in this project (upload it: POST /v1/code)"
        )
    if code.requirements and not settings.allow_requirements:
        raise SpecRejected(
            (*loc, "code", "requirements"),
            "pip requirements are not allowed on this cluster (ORCHESTRATOR_ALLOW_REQUIREMENTS is off): "
            "put the packages in the code itself, or ask the operator",
        )


def _never_fits_now(demand: Demand | JobSpec, clusters: Mapping[str, ClusterBackend]) -> str | None:
    """Why ``demand`` can never run on any of the clusters, or None. A rejection is checked against each cluster
    as it is now, not a cached view that predates a node that just joined."""
    reasons = []
    for name, backend in clusters.items():
        try:
            reason = never_fits(demand, backend.capacity())
            reason = reason and never_fits(demand, backend.capacity(fresh=True))
        except BackendUnavailable as exc:
            # Accept it: the scheduler checks again, and fails the run with a reason if it never fits.
            log.warning("could not check the capacity of cluster %s at submit: %s", name, exc)
            return None
        if reason is None:
            return None
        reasons.append(reason if len(clusters) == 1 else f"{name}: {reason}")
    return "; ".join(reasons) or None


def _which(clusters: Mapping[str, ClusterBackend]) -> str:
    return "this cluster" if len(clusters) == 1 else "any of the clusters it may use"


def check_sweep_runnable(spec: SweepSpec, settings: Settings, clusters: Mapping[str, ClusterBackend]) -> SweepSpec:
    """``check_runnable`` for the base job, and room for the concurrent trials; returns the spec to store
    (a base strategy ``auto`` resolved by the planner, for every trial; data paths pinned)."""
    try:
        plan = check_runnable(spec.base, settings, clusters)
        spec = spec.model_copy(update={"base": pin_data_paths(spec.base, settings)})
    except SpecRejected as exc:
        raise SpecRejected(("base", *exc.loc), str(exc)) from None
    problem = metric_never_reported(spec.base.workload, spec.metric, settings.max_metric_name_chars)
    if problem:  # else Ray Tune fails the sweep at its first result
        raise SpecRejected(("metric",), problem)
    spec = pin_sweep_data_paths(spec, settings)
    if spec.base.strategy == "auto":
        data = spec.model_dump(mode="json")
        data["base"]["strategy"] = plan.strategy
        spec = SweepSpec.model_validate(data)
    reason = _never_fits_now(sweep_demand(spec), clusters)
    if reason:
        raise SpecRejected(("max_concurrent_trials",), f"this sweep can never run on {_which(clusters)}: {reason}")
    return spec
