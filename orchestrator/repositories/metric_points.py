"""A job's metric points read for charts: the plain columns (no ORM objects: a job may have 100,000 points),
and a cheap version stamp that changes whenever a point is added or merged."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from sqlalchemy import Text, func, select, type_coerce
from sqlalchemy.orm import Session

from orchestrator.db.models import JobMetric


def job_metric_points(
    session: Session, job_id: str, with_time: bool = True
) -> list[tuple[int, int, int, datetime | None, dict[str, Any]]]:
    """``(attempt, epoch, step, created_at, values)`` of every point, in (attempt, step) order (the REST
    metrics route's order, ``jobs.page_metrics``); ``created_at`` None unless ``with_time``.

    The values are read as text and parsed here: SQLAlchemy's JSON result processing cost more than the
    query itself at 100,000 points (bench/ui_job_page.py). PostgreSQL's driver hands over parsed JSON already.
    """
    columns = [JobMetric.attempt, JobMetric.epoch, JobMetric.step, type_coerce(JobMetric.values, Text)]
    if with_time:
        columns.append(JobMetric.created_at)
    query = select(*columns).where(JobMetric.job_id == job_id).order_by(JobMetric.attempt, JobMetric.step)
    loads = json.loads
    return [
        (row[0], row[1], row[2], row[4] if with_time else None, row[3] if isinstance(row[3], dict) else loads(row[3]))
        for row in session.execute(query)
    ]


def job_metrics_stamp(session: Session, job_id: str) -> tuple[int, int | None]:
    """How many points the job has and the newest point's id: a new point changes it. A merge into an existing
    point (a repeated report) does not, which is why callers add the job's ``updated_at`` (a merge updates the
    job's latest metrics, so the row changes)."""
    count, newest = session.execute(
        select(func.count(), func.max(JobMetric.id)).where(JobMetric.job_id == job_id)
    ).one()
    return int(count), newest
