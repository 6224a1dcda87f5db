"""usage accounting per attempt (docs/usage.md)

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-26 09:00:00.000000

usage_intervals: one row per stretch of time a run held its reserved resources (jobs and trials while
RUNNING, deployments while they serve), written by the state engine from now on (orchestrator.states.usage_ledger)
and filled in here from the history rows of the runs that already exist (the same rules, read back from
job_events, trial_events and deployment_events).
"""

from __future__ import annotations

import copy
import json
from datetime import UTC

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

_RUN_HELD = ("RUNNING", "CANCELLING")
_RUN_NOT_WASTED = ("SUCCEEDED", "CANCELLED")
_DEPLOYMENT_HELD = ("DEPLOYING", "HEALTHY", "UPDATING", "UNHEALTHY")


def upgrade() -> None:
    op.create_table(
        "usage_intervals",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("project_id", sa.String(length=32), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("subject_id", sa.String(length=32), nullable=False),
        sa.Column("sweep_id", sa.String(length=32), nullable=True),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("workers", sa.Integer(), nullable=False),
        sa.Column("cpus", sa.Double(), nullable=False),
        sa.Column("gpus", sa.Double(), nullable=False),
        sa.Column("memory_gb", sa.Double(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("wasted_from", sa.DateTime(timezone=True), nullable=True),
        sa.Column("end_state", sa.String(length=16), nullable=False),
        sa.Column("end_reason", sa.String(length=64), nullable=False),
        sa.ForeignKeyConstraint(["project_id"], ["projects.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_usage_intervals_project_ended", "usage_intervals", ["project_id", "ended_at"], unique=False)
    op.create_index("ix_usage_intervals_ended", "usage_intervals", ["ended_at"], unique=False)
    op.create_index("ix_usage_intervals_subject", "usage_intervals", ["subject_id", "id"], unique=False)
    _backfill(op.get_bind())


def downgrade() -> None:
    op.drop_index("ix_usage_intervals_subject", table_name="usage_intervals")
    op.drop_index("ix_usage_intervals_ended", table_name="usage_intervals")
    op.drop_index("ix_usage_intervals_project_ended", table_name="usage_intervals")
    op.drop_table("usage_intervals")


# --- the runs that already exist -----------------------------------------------------------------------


def _utc(value):
    if isinstance(value, str):  # SQLite without the ORM's type
        from datetime import datetime

        value = datetime.fromisoformat(value)
    return value.replace(tzinfo=UTC) if value is not None and value.tzinfo is None else value


def _json(value):
    return json.loads(value) if isinstance(value, str) else (value or {})


def _scaling(spec: dict) -> dict:
    scaling = spec.get("scaling") or {}
    use_gpu = bool(scaling.get("use_gpu"))
    gpus = scaling.get("gpus_per_worker")
    memory = scaling.get("memory_per_worker_gb")
    return {
        "workers": int(scaling.get("num_workers", 2)),
        "cpus": float(scaling.get("cpus_per_worker", 1.0)),
        "gpus": float((1.0 if use_gpu else 0.0) if gpus is None else gpus),
        "memory_gb": float((16.0 if use_gpu else 4.0) if memory is None else memory),
    }


def _run_stretches(events, not_wasted, held_open, held):
    """(started_at, ended_at or None, end_state, end_reason, attempt) from one run's history in order."""
    out, start, attempt = [], None, 0
    for to_state, reason, at, event_attempt in events:
        if start is None:
            if to_state == held_open:
                start, attempt = at, event_attempt
        elif to_state not in held:
            out.append((start, at, to_state, reason, attempt))
            start = None
    if start is not None:
        out.append((start, None, "", "", attempt))
    return out


def _backfill(bind) -> None:
    rows = []
    meta = sa.MetaData()
    jobs = sa.Table("jobs", meta, autoload_with=bind)
    job_events = sa.Table("job_events", meta, autoload_with=bind)
    checkpoints = sa.Table("checkpoints", meta, autoload_with=bind)
    held = {}
    for job_id, project_id, spec in bind.execute(
        sa.select(jobs.c.id, jobs.c.project_id, jobs.c.spec).where(jobs.c.started_at.is_not(None))
    ):
        held[job_id] = (project_id, _scaling(_json(spec)))
    history: dict[str, list] = {}
    query = sa.select(
        job_events.c.job_id, job_events.c.to_state, job_events.c.reason, job_events.c.created_at, job_events.c.attempt
    ).order_by(job_events.c.job_id, job_events.c.id)
    for job_id, to_state, reason, at, attempt in bind.execute(query):
        if job_id in held:
            history.setdefault(job_id, []).append((to_state, reason, _utc(at), attempt))
    for job_id, events in history.items():
        project_id, scaling = held[job_id]
        for start, end, state, reason, attempt in _run_stretches(events, _RUN_NOT_WASTED, "RUNNING", _RUN_HELD):
            wasted_from = None
            if end is not None and state not in _RUN_NOT_WASTED:
                last = bind.execute(
                    sa.select(sa.func.max(checkpoints.c.created_at)).where(
                        checkpoints.c.job_id == job_id, checkpoints.c.created_at >= start
                    )
                ).scalar()
                wasted_from = min(max(_utc(last) or start, start), end)
            rows.append(_row(project_id, "job", job_id, None, attempt, scaling, start, end, wasted_from, state, reason))
    rows += _backfill_trials(bind, meta)
    rows += _backfill_deployments(bind, meta)
    if rows:
        usage = sa.Table("usage_intervals", meta, autoload_with=bind)
        for i in range(0, len(rows), 1000):
            bind.execute(usage.insert(), rows[i : i + 1000])


def _row(project_id, kind, subject_id, sweep_id, attempt, held, start, end, wasted_from, state, reason) -> dict:
    return {
        "project_id": project_id,
        "kind": kind,
        "subject_id": subject_id,
        "sweep_id": sweep_id,
        "attempt": attempt or 0,
        **held,
        "started_at": start,
        "ended_at": end,
        "wasted_from": wasted_from,
        "end_state": (state or "")[:16],
        "end_reason": (reason or "")[:64],
    }


def _backfill_trials(bind, meta) -> list[dict]:
    sweeps = sa.Table("sweeps", meta, autoload_with=bind)
    trials = sa.Table("trials", meta, autoload_with=bind)
    trial_events = sa.Table("trial_events", meta, autoload_with=bind)
    trial_metrics = sa.Table("trial_metrics", meta, autoload_with=bind)
    found = bind.execute(
        sa.select(trials.c.id, trials.c.config, sweeps.c.id, sweeps.c.project_id, sweeps.c.spec)
        .join(sweeps, sweeps.c.id == trials.c.sweep_id)
        .where(trials.c.started_at.is_not(None))
    ).all()
    rows = []
    for trial_id, config, sweep_id, project_id, spec in found:
        base = copy.deepcopy(_json(spec).get("base") or {})
        for path, value in _json(config).items():  # the trial's config, by dotted path into the base
            *parents, leaf = path.split(".")
            node = base
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = value
        events = [
            (to_state, reason, _utc(at), attempt)
            for to_state, reason, at, attempt in bind.execute(
                sa.select(
                    trial_events.c.to_state, trial_events.c.reason, trial_events.c.created_at, trial_events.c.attempt
                )
                .where(trial_events.c.trial_id == trial_id)
                .order_by(trial_events.c.id)
            )
        ]
        for start, end, state, reason, attempt in _run_stretches(events, (), "RUNNING", ("RUNNING",)):
            wasted_from = None
            if end is not None and state == "FAILED":
                last = bind.execute(
                    sa.select(sa.func.max(trial_metrics.c.created_at)).where(
                        trial_metrics.c.trial_id == trial_id,
                        trial_metrics.c.created_at >= start,
                        trial_metrics.c.checkpoint_path.is_not(None),
                    )
                ).scalar()
                wasted_from = min(max(_utc(last) or start, start), end)
            rows.append(
                _row(
                    project_id,
                    "trial",
                    trial_id,
                    sweep_id,
                    attempt,
                    _scaling(base),
                    start,
                    end,
                    wasted_from,
                    state,
                    reason,
                )
            )
    return rows


def _backfill_deployments(bind, meta) -> list[dict]:
    deployments = sa.Table("deployments", meta, autoload_with=bind)
    events = sa.Table("deployment_events", meta, autoload_with=bind)
    versions = sa.Table("deployment_versions", meta, autoload_with=bind)
    settings = {
        (deployment_id, number): _json(value)
        for deployment_id, number, value in bind.execute(
            sa.select(versions.c.deployment_id, versions.c.version, versions.c.settings)
        )
    }
    rows = []
    for deployment_id, project_id in bind.execute(sa.select(deployments.c.id, deployments.c.project_id)):
        history = bind.execute(
            sa.select(events.c.to_state, events.c.reason, events.c.created_at, events.c.version)
            .where(events.c.deployment_id == deployment_id)
            .order_by(events.c.id)
        ).all()
        for i, (to_state, _reason, at, number) in enumerate(history):
            if to_state not in _DEPLOYMENT_HELD:
                continue
            end, end_state, end_reason = (None, "", "")
            if i + 1 < len(history):
                end_state, end_reason, end, _ = history[i + 1]
            held = settings.get((deployment_id, number), {})
            replicas = held.get("replicas", 1)
            replicas = int(replicas.get("min", 1) or 0) if isinstance(replicas, dict) else int(replicas)
            resources = held.get("resources") or {}
            amounts = {
                "workers": replicas if held else 0,
                "cpus": float(resources.get("cpus") or 0.0),
                "gpus": float(resources.get("gpus") or 0.0),
                "memory_gb": 0.0,
            }
            rows.append(
                _row(
                    project_id,
                    "deployment",
                    deployment_id,
                    None,
                    number,
                    amounts,
                    _utc(at),
                    _utc(end),
                    None,
                    end_state,
                    end_reason,
                )
            )
    return rows
