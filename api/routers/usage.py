"""``GET /v1/usage``: what runs held, and for how long (docs/usage.md)."""

from __future__ import annotations

import csv
import io
from typing import Annotated

from fastapi import APIRouter, Header, Query, Response

from api.deps import CurrentKey, SessionDep
from orchestrator.db.models import utcnow
from orchestrator.usage import parse_group_by, parse_instant, usage_report, window
from orchestrator.use_cases.projects import visible_project
from orchestrator_contract.rest.usage import CSV_COLUMNS, GROUP_BY_DESCRIPTION, UsageReport

router = APIRouter(prefix="/v1/usage", tags=["usage"])

CSV = "text/csv"


@router.get(
    "",
    summary="Usage: resources held, by project, run, label or day",
    response_model=UsageReport,
    response_model_by_alias=True,
    responses={200: {"content": {CSV: {}}, "description": "JSON, or CSV with Accept: text/csv"}},
)
def get_usage(
    session: SessionDep,
    principal: CurrentKey,
    project_id: Annotated[
        str | None,
        Query(max_length=64, description="The project; default: the key's own (cluster-wide admins: every project)."),
    ] = None,
    from_: Annotated[
        str | None,
        Query(
            alias="from", max_length=64, description="Window start, ISO 8601 (UTC if no zone); default: to - 30 days."
        ),
    ] = None,
    to: Annotated[
        str | None, Query(max_length=64, description="Window end (exclusive), ISO 8601; default: now.")
    ] = None,
    group_by: Annotated[str, Query(max_length=70, description=GROUP_BY_DESCRIPTION)] = "project",
    accept: Annotated[str | None, Header()] = None,
):
    """Every stretch a job, trial or deployment held its reserved resources, clipped to [from, to) and grouped;
    a stretch still held counts up to now. A project's keys (any role) see their own project; cluster-wide
    admins every project, or one with `project_id`. Another project is a 404. CSV (one line per row, the
    total last) with `Accept: text/csv`."""
    now = utcnow()
    mode, _ = parse_group_by(group_by)
    start, end = window(parse_instant(from_, "from"), parse_instant(to, "to"), now, mode)
    scope = principal.project_scope() if project_id is None else visible_project(session, principal, project_id)
    report = usage_report(session, project_id=scope, start=start, end=end, group_by=group_by, now=now)
    if accept and CSV in accept.lower():
        return Response(to_csv(report), media_type=f"{CSV}; charset=utf-8")
    return report


def to_csv(report: UsageReport) -> str:
    """One line per row (the CSV_COLUMNS), then a line keyed ``total``; per-attempt and per-trial detail is in
    the JSON only."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for row in report.rows:
        values = row.model_dump()
        writer.writerow(["" if values.get(c) is None else values.get(c) for c in CSV_COLUMNS])
    total = report.total.model_dump()
    writer.writerow(["total", "total", "", report.project_id or ""] + [total[c] for c in CSV_COLUMNS[4:]])
    return out.getvalue()
