"""Bounds on what a run's driver reports (docs/security.md, hole 6): distinct metric names, a metric name's
length and characters (``orchestrator_contract.metrics``), the size of a job's ``result`` and of a trial's
config. A batch past one is refused whole (422, nothing applied) with a message naming the setting (or
the bad name), before anything of it is applied. And a project's ``max_priority`` (docs/security.md, hole 7)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from sqlalchemy.orm import Session

from orchestrator.db.models import Job, Project
from orchestrator.errors import Invalid
from orchestrator.services.submission import SpecRejected
from orchestrator.settings import Settings
from orchestrator_contract.jobs import CheckpointEvent, EventBatch, MetricsEvent, StateEvent
from orchestrator_contract.metrics import POSITION_KEYS, metric_name_problem
from orchestrator_contract.sweeps import SweepEventBatch, TrialEvent


class OverLimit(Invalid):
    """422: a reported batch passes a bound; the message names the bound's setting."""


def _check_names(names: Iterable[str], settings: Settings, where: str) -> None:
    for name in names:
        if len(name) > settings.max_metric_name_chars:
            raise OverLimit(
                f"metric name {name[:40]!r}... in {where} is {len(name)} characters: at most "
                f"{settings.max_metric_name_chars} (ORCHESTRATOR_MAX_METRIC_NAME_CHARS)"
            )
        problem = metric_name_problem(name, settings.max_metric_name_chars)
        if problem:
            raise Invalid(f"{problem}, in {where}")


def _check_size(value: Any, settings: Settings, what: str) -> None:
    size = len(json.dumps(value, separators=(",", ":"), default=str).encode())
    if size > settings.max_result_kb * 1024:
        raise OverLimit(
            f"{what} is {size} bytes of JSON: at most {settings.max_result_kb:g} KB (ORCHESTRATOR_MAX_RESULT_KB)"
        )


def _check_count(names: set[str], settings: Settings, where: str) -> None:
    if len(names) > settings.max_metric_names:
        raise OverLimit(
            f"{where} would have {len(names)} distinct metric names: at most "
            f"{settings.max_metric_names} (ORCHESTRATOR_MAX_METRIC_NAMES)"
        )


def check_job_batch(job: Job, batch: EventBatch, settings: Settings) -> None:
    """A job's distinct metric names (those it has, ``latest_metrics``, and the batch's) stay within the cap,
    every name within its length, a reported result within its size."""
    names = set(job.latest_metrics or {}) - POSITION_KEYS
    for event in batch.events:
        if isinstance(event, MetricsEvent):
            _check_names(event.values, settings, f"job {job.id}'s metrics")
            names |= set(event.values)
        elif isinstance(event, CheckpointEvent):
            _check_names(event.metrics, settings, f"job {job.id}'s checkpoint")
            _check_count(set(event.metrics), settings, f"a checkpoint of job {job.id}")
        elif isinstance(event, StateEvent) and event.result is not None:
            _check_size(event.result, settings, f"job {job.id}'s result")
    _check_count(names, settings, f"job {job.id}")


def check_sweep_batch(batch: SweepEventBatch, settings: Settings) -> None:
    """A trial's reported config within its size; each of its metric points within the name caps."""
    for event in batch.events:
        if isinstance(event, TrialEvent):
            if event.config is not None:
                _check_size(event.config, settings, f"trial {event.trial}'s config")
            _check_names(event.metrics, settings, f"trial {event.trial}'s metrics")
            _check_count(set(event.metrics), settings, f"a metric point of trial {event.trial}")
        elif isinstance(event, StateEvent) and event.result is not None:
            _check_size(event.result, settings, "the sweep's result")


def check_priority(session: Session, project_id: str, priority: int, cluster_admin: bool, loc: tuple[str, ...]) -> None:
    """A job's or sweep's priority within its project's ``max_priority`` (docs/security.md, hole 7): 422 above it.
    Cluster-wide admins, who set the cap, are not held to it."""
    project = session.get(Project, project_id)
    cap = project.max_priority if project is not None else None
    if cap is not None and priority > cap and not cluster_admin:
        raise SpecRejected(
            loc,
            f"priority {priority} is above this project's max_priority {cap} "
            "(set by a cluster-wide admin: PATCH /v1/projects/{id})",
        )


def check_preemptible(session: Session, project_id: str, preemptible: bool, cluster_admin: bool) -> None:
    """``preemptible: false`` (docs/scheduling.md): a cluster-wide admin's key, or a key of a project that allows it
    (``allow_non_preemptible``, set by a cluster-wide admin); any other key is a 422 that says so."""
    if preemptible or cluster_admin:
        return
    project = session.get(Project, project_id)
    if project is None or not project.allow_non_preemptible:
        raise SpecRejected(
            ("preemptible",),
            "preemptible: false needs a cluster-wide admin's key, or a project that allows it "
            "(a cluster-wide admin sets allow_non_preemptible: PATCH /v1/projects/{id})",
        )
