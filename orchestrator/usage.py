"""Usage accounting (docs/usage.md): what runs held, read back from the ledger the state engine writes
(``usage_intervals``; the rules in ``orchestrator.states.usage_ledger``), clipped to a window and grouped.

A window [start, end) reads the stretches that end after ``start`` or are still open (two index range
scans: ``ix_usage_intervals_project_ended`` in a project, ``ix_usage_intervals_ended`` across projects),
and keeps those that began before ``end``. A stretch still open counts up to ``now``. All arithmetic is in
seconds, in Python, the same on SQLite and PostgreSQL.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestrator.db.models import Deployment, Job, JobLabel, Project, Sweep, UsageInterval, utcnow
from orchestrator.errors import Invalid
from orchestrator.repositories import jobs as jobs_repo
from orchestrator.repositories.by_ids import rows_for_ids
from orchestrator.services.goodput import as_out, measure_jobs
from orchestrator_contract.rest.usage import LABEL_KEY, UsageAmounts, UsageAttempt, UsageReport, UsageRow, UsageTrial

GROUP_BY_MODES = ("project", "job", "label:<key>", "day")
MAX_DAYS = 3660  # group_by=day over at most ten years: a row a day


@dataclass
class _Sum:
    seconds: float = 0.0
    worker_seconds: float = 0.0
    cpu_seconds: float = 0.0
    gpu_seconds: float = 0.0
    memory_gb_seconds: float = 0.0
    wasted_seconds: float = 0.0
    wasted_cpu_seconds: float = 0.0
    wasted_gpu_seconds: float = 0.0

    def add(self, row: Any, held: float, wasted: float) -> None:
        self.seconds += held
        self.worker_seconds += row.workers * held
        self.cpu_seconds += row.workers * row.cpus * held
        self.gpu_seconds += row.workers * row.gpus * held
        self.memory_gb_seconds += row.workers * row.memory_gb * held
        self.wasted_seconds += wasted
        self.wasted_cpu_seconds += row.workers * row.cpus * wasted
        self.wasted_gpu_seconds += row.workers * row.gpus * wasted

    def amounts(self) -> dict[str, float]:
        values = {name: round(value, 3) for name, value in vars(self).items()}
        values["training_seconds"] = round(self.seconds - self.wasted_seconds, 3)
        return values


@dataclass
class _Group:
    total: _Sum = field(default_factory=_Sum)
    jobs: set[tuple[str, datetime, datetime]] = field(default_factory=set)  # (job id, window): for its goodput
    attempts: dict[int, tuple[_Sum, list[str]]] = field(default_factory=dict)
    trials: dict[str, _Sum] = field(default_factory=dict)


def parse_group_by(group_by: str) -> tuple[str, str | None]:
    """('project'|'job'|'day', None) or ('label', key); Invalid (422) naming what is accepted."""
    if group_by in ("project", "job", "day"):
        return group_by, None
    if group_by.startswith("label:"):
        key = group_by.removeprefix("label:")
        if not LABEL_KEY.match(key):
            raise Invalid(
                f"group_by {group_by!r}: a label key is 1 to 63 letters, digits, '_', '.', '-' or '/' (e.g. label:team)",
                ("query", "group_by"),
            )
        return "label", key
    raise Invalid(f"group_by {group_by!r}: use one of {', '.join(GROUP_BY_MODES)}", ("query", "group_by"))


def parse_instant(value: str | None, name: str) -> datetime | None:
    """An ISO 8601 date or date-time (UTC when it names no zone); Invalid (422) saying the format."""
    if value is None or value == "":
        return None
    try:
        parsed = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        raise Invalid(
            f"{name} {value!r} is not a date: use ISO 8601, e.g. 2026-11-01 or 2026-11-01T12:00:00Z",
            ("query", name),
        ) from None
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


def window(start: datetime | None, end: datetime | None, now: datetime, group: str) -> tuple[datetime, datetime]:
    """The window [start, end): ``to`` defaults to now, ``from`` to 30 days before ``to``."""
    end = end or now
    start = start or end - timedelta(days=30)
    if start >= end:
        raise Invalid(
            f"from ({start.isoformat()}) must be before to ({end.isoformat()}): the window is [from, to)",
            ("query", "from"),
        )
    if group == "day" and end - start > timedelta(days=MAX_DAYS):
        raise Invalid(f"group_by=day covers at most {MAX_DAYS} days; narrow from/to", ("query", "from"))
    return start, end


_COLUMNS = (
    UsageInterval.project_id,
    UsageInterval.kind,
    UsageInterval.subject_id,
    UsageInterval.sweep_id,
    UsageInterval.attempt,
    UsageInterval.workers,
    UsageInterval.cpus,
    UsageInterval.gpus,
    UsageInterval.memory_gb,
    UsageInterval.started_at,
    UsageInterval.ended_at,
    UsageInterval.wasted_from,
    UsageInterval.end_state,
    UsageInterval.end_reason,
)


def load_intervals(session: Session, project_id: str | None, start: datetime, end: datetime) -> list[Any]:
    """Stretches overlapping [start, end): closed ones ending after ``start``, and the open ones (plain rows
    with the ledger's column names, not ORM objects: a year of 10,000 jobs is tens of thousands)."""
    rows: list[Any] = []
    for ended in (UsageInterval.ended_at > start, UsageInterval.ended_at.is_(None)):
        query = select(*_COLUMNS).where(ended, UsageInterval.started_at < end)
        if project_id is not None:
            query = query.where(UsageInterval.project_id == project_id)
        rows.extend(session.execute(query.order_by(UsageInterval.id)))
    return rows


def _by_ids(session: Session, columns: tuple, id_column, ids: list[str]) -> list[Any]:
    """Rows whose ``id_column`` is one of ``ids``, by primary key."""
    return rows_for_ids(session, lambda condition: select(*columns).where(condition), id_column, ids)


def _overlap(a: datetime, b: datetime, start: datetime, end: datetime) -> float:
    return max(0.0, (min(b, end) - max(a, start)).total_seconds())


def _days(a: datetime, b: datetime) -> list[tuple[str, datetime, datetime]]:
    """[a, b) cut at UTC midnights: (date, day start, day end)."""
    out = []
    day = datetime(a.year, a.month, a.day, tzinfo=UTC)
    while day < b:
        following = day + timedelta(days=1)
        out.append((day.date().isoformat(), day, following))
        day = following
    return out


def usage_report(
    session: Session,
    *,
    project_id: str | None,
    start: datetime,
    end: datetime,
    group_by: str,
    now: datetime | None = None,
) -> UsageReport:
    """The report of ``GET /v1/usage`` for one project (or all: ``project_id`` None), [start, end) clipped."""
    now = now or utcnow()
    mode, label_key = parse_group_by(group_by)
    intervals = load_intervals(session, project_id, start, end)
    labels = _labels(session, intervals, label_key) if mode == "label" else {}
    groups: dict[tuple[str, str], _Group] = defaultdict(_Group)
    total = _Sum()
    total_jobs: set[tuple[str, datetime, datetime]] = set()
    for row in intervals:
        ended = row.ended_at or now
        pieces = _days(max(row.started_at, start), min(ended, end)) if mode == "day" else [("", start, end)]
        for day, lo, hi in pieces:
            held = _overlap(row.started_at, ended, lo, hi)
            wasted = _overlap(row.wasted_from, row.ended_at, lo, hi) if row.wasted_from and row.ended_at else 0.0
            if held <= 0:
                continue
            if mode == "project":
                key = ("project", row.project_id)
            elif mode == "day":
                key = ("day", day)
            elif mode == "label":
                key = ("label", labels.get(row.subject_id, "") if row.kind == "job" else "")
            elif row.kind == "trial":
                key = ("sweep", row.sweep_id or "")
            else:
                key = (row.kind, row.subject_id)
            group = groups[key]
            group.total.add(row, held, wasted)
            total.add(row, held, wasted)
            if row.kind == "job":
                group.jobs.add((row.subject_id, lo, hi))
                total_jobs.add((row.subject_id, start, end))
            if mode == "job":
                attempt = group.attempts.setdefault(row.attempt, (_Sum(), ["", ""]))
                attempt[0].add(row, held, wasted)
                attempt[1][:] = [row.end_state, row.end_reason]
                if row.kind == "trial":
                    group.trials.setdefault(row.subject_id, _Sum()).add(row, held, wasted)
    # Every job's history, checkpoints and last reports in three queries for the whole report, not per row.
    evidence = jobs_repo.goodput_evidence(session, sorted({job_id for job_id, _, _ in total_jobs}))
    rows = _rows(session, mode, groups, evidence, now)
    return UsageReport(
        from_=start,
        to=end,
        group_by=group_by,
        project_id=project_id,
        generated_at=now,
        rows=rows,
        total=UsageAmounts(**total.amounts()),
        goodput=_goodput(evidence, total_jobs, now),
    )


def _goodput(evidence: dict, jobs: set[tuple[str, datetime, datetime]], now: datetime):
    """The jobs' goodput, each clipped to its window; None without a job (sweeps and deployments have none)."""
    if not jobs:
        return None
    return as_out(measure_jobs(evidence, ((job_id, (lo, hi)) for job_id, lo, hi in sorted(jobs)), now))


def _labels(session: Session, intervals: list[Any], key: str | None) -> dict[str, str]:
    """job id -> its value of label ``key``, for the jobs among ``intervals`` (by the labels' primary key)."""
    job_ids = sorted({row.subject_id for row in intervals if row.kind == "job"})
    found = _by_ids(session, (JobLabel.job_id, JobLabel.key, JobLabel.value), JobLabel.job_id, job_ids)
    return {job_id: value for job_id, label, value in found if label == key}


def _names(session: Session, model, ids: list[str]) -> dict[str, tuple[str, str]]:
    """id -> (name, project_id) of rows of ``model``, read by primary key."""
    project = model.id if model is Project else model.project_id
    return {
        row_id: (name, project_id)
        for row_id, name, project_id in _by_ids(session, (model.id, model.name, project), model.id, ids)
    }


def _rows(
    session: Session, mode: str, groups: dict[tuple[str, str], _Group], evidence: dict, now: datetime
) -> list[UsageRow]:
    names: dict[str, tuple[str, str]] = {}
    if mode == "project":
        names = _names(session, Project, [key for _, key in groups])
    elif mode == "job":
        for kind, model in (("job", Job), ("sweep", Sweep), ("deployment", Deployment)):
            names.update(_names(session, model, [key for k, key in groups if k == kind]))
    out = []
    for (kind, key), group in sorted(groups.items(), key=lambda item: (item[0][0] != "day", item[0][1])):
        name, project_id = names.get(key, ("", None))
        if mode == "project":
            project_id = key
        row = UsageRow(
            key=key,
            kind=kind,
            name=name,
            project_id=project_id,
            goodput=_goodput(evidence, group.jobs, now),
            **group.total.amounts(),
        )
        if mode == "job":
            row.attempts = [
                UsageAttempt(attempt=number, ended=ended[0], reason=ended[1], **amounts.amounts())
                for number, (amounts, ended) in sorted(group.attempts.items())
            ]
            if kind == "sweep":
                row.trials = [
                    UsageTrial(trial_id=t, **amounts.amounts()) for t, amounts in sorted(group.trials.items())
                ]
        out.append(row)
    if mode == "job":  # the biggest first: what people look for
        out.sort(key=lambda row: (-row.cpu_seconds - row.gpu_seconds, row.key))
    return out
