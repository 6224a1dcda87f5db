"""A job's metric points read for charts: the plain columns (no ORM objects: a job may have 100,000 points),
and a cheap version stamp that changes whenever a point is added or merged."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from orchestrator.db.models import JobMetric


def job_metric_points(session: Session, job_id: str) -> list[tuple[int, int, int, datetime, dict[str, Any]]]:
    """``(attempt, epoch, step, created_at, values)`` of every point, in (attempt, step) order (the REST
    metrics route's order, ``jobs.page_metrics``)."""
    query = (
        select(JobMetric.attempt, JobMetric.epoch, JobMetric.step, JobMetric.created_at, JobMetric.values)
        .where(JobMetric.job_id == job_id)
        .order_by(JobMetric.attempt, JobMetric.step)
    )
    return [tuple(row) for row in session.execute(query)]


def job_metrics_stamp(session: Session, job_id: str) -> tuple[int, int | None]:
    """How many points the job has and the newest point's id: a new point changes it. A merge into an existing
    point (a repeated report) does not, which is why callers add the job's ``updated_at`` (a merge updates the
    job's latest metrics, so the row changes)."""
    count, newest = session.execute(
        select(func.count(), func.max(JobMetric.id)).where(JobMetric.job_id == job_id)
    ).one()
    return int(count), newest
