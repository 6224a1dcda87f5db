"""list indexes: every list filter and keyset cursor of the REST API is served by an index (docs/benchmarks.md)

Composite indexes in each list's keyset order replace the single-column ones they start with
(job_metrics' own job_id index goes: its unique (job_id, attempt, step) serves every query by job).
Plain CREATE INDEX: the migration runs before any control plane starts (the chart's migration Job).

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-26 06:30:00.000000
"""

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

_NAME_OPS = {"postgresql_ops": {"name": "varchar_pattern_ops"}}

# (table, the index this one replaces or None, the new index's name, its columns, options)
_CHANGES = [
    ("jobs", "ix_jobs_project_created", "ix_jobs_project_created", ["project_id", "created_at", "id"], {}),
    ("jobs", None, "ix_jobs_created", ["created_at", "id"], {}),
    ("jobs", None, "ix_jobs_project_state_created", ["project_id", "state", "created_at", "id"], {}),
    ("jobs", None, "ix_jobs_state_created", ["state", "created_at", "id"], {}),
    ("jobs", None, "ix_jobs_project_name", ["project_id", "name"], _NAME_OPS),
    ("jobs", None, "ix_jobs_name", ["name"], _NAME_OPS),
    ("jobs", None, "ix_jobs_finished_at", ["finished_at"], {}),
    ("job_events", "ix_job_events_job_id", "ix_job_events_job_id_id", ["job_id", "id"], {}),
    ("job_metrics", "ix_job_metrics_job_id", None, [], {}),
    ("checkpoints", "ix_checkpoints_job_id", "ix_checkpoints_job_step", ["job_id", "step", "id"], {}),
    (
        "deployments",
        "ix_deployments_project_created",
        "ix_deployments_project_created",
        ["project_id", "created_at", "id"],
        {},
    ),
    (
        "deployment_events",
        "ix_deployment_events_deployment_id",
        "ix_deployment_events_deployment_id_id",
        ["deployment_id", "id"],
        {},
    ),
    ("sweeps", "ix_sweeps_project_created", "ix_sweeps_project_created", ["project_id", "created_at", "id"], {}),
    ("sweeps", None, "ix_sweeps_created", ["created_at", "id"], {}),
    ("sweep_events", "ix_sweep_events_sweep_id", "ix_sweep_events_sweep_id_id", ["sweep_id", "id"], {}),
    ("trials", "ix_trials_sweep_id", "ix_trials_sweep_number", ["sweep_id", "number", "id"], {}),
    ("trial_events", "ix_trial_events_trial_id", "ix_trial_events_trial_id_id", ["trial_id", "id"], {}),
]

# The columns of the indexes this migration drops, for the downgrade.
_OLD_COLUMNS = {
    "ix_jobs_project_created": ["project_id", "created_at"],
    "ix_job_events_job_id": ["job_id"],
    "ix_job_metrics_job_id": ["job_id"],
    "ix_checkpoints_job_id": ["job_id"],
    "ix_deployments_project_created": ["project_id", "created_at"],
    "ix_deployment_events_deployment_id": ["deployment_id"],
    "ix_sweeps_project_created": ["project_id", "created_at"],
    "ix_sweep_events_sweep_id": ["sweep_id"],
    "ix_trials_sweep_id": ["sweep_id"],
    "ix_trial_events_trial_id": ["trial_id"],
}


def upgrade() -> None:
    for table, old, new, columns, options in _CHANGES:
        if old is not None:
            op.drop_index(old, table_name=table)
        if new is not None:
            op.create_index(new, table, columns, unique=False, **options)


def downgrade() -> None:
    for table, old, new, _columns, _options in reversed(_CHANGES):
        if new is not None:
            op.drop_index(new, table_name=table)
        if old is not None:
            op.create_index(old, table, _OLD_COLUMNS[old], unique=False)
