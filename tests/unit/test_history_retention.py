"""History retention (ORCHESTRATOR_HISTORY_DAYS, docs/configuration.md): the metric points of jobs that ended long ago
go, in bounded batches; the job row and its summary stay. On SQLite and PostgreSQL; the clock is moved by dating rows in
the past and by ``tick(now=...)``, as the other retention tests move it."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import func, select

from orchestrator.db.models import Checkpoint, Job, JobEvent, JobMetric, JobState, utcnow
from orchestrator.loops import retention
from orchestrator.loops.retention import CheckpointJanitor, HistoryRetention
from orchestrator.repositories import projects as projects_repo
from orchestrator.settings import Settings
from orchestrator.storage import CheckpointStorage

POINTS = 5


def _job(sessions, state: JobState, ended_days_ago: float | None, started_days_ago: float = 60) -> str:
    """A job that ran (``POINTS`` metric points, one checkpoint) and ended ``ended_days_ago`` (None: still runs)."""
    now = utcnow()
    started = now - timedelta(days=started_days_ago)
    with sessions.begin() as session:
        project = projects_repo.ensure_default_project(session)
        job = Job(
            project_id=project.id,
            workload="digits",
            spec={"workload": "digits"},
            state=state,
            attempt=1,
            token_hash="",
            latest_metrics={"loss": 0.1, "step": POINTS},
            result={"val_accuracy": 0.97} if state == JobState.SUCCEEDED else None,
            created_at=started,
            started_at=started,
            finished_at=None if ended_days_ago is None else now - timedelta(days=ended_days_ago),
        )
        session.add(job)
        session.flush()
        for step in range(1, POINTS + 1):
            at = started + timedelta(minutes=step)
            session.add(
                JobMetric(job_id=job.id, attempt=1, epoch=0, step=step, values={"loss": 1 / step}, created_at=at)
            )
        session.add(Checkpoint(job_id=job.id, attempt=1, epoch=0, step=POINTS, path=f"/c/{job.id}", metrics={}))
        session.add(JobEvent(job_id=job.id, to_state=JobState.QUEUED, created_at=started))
        return job.id


def _points(sessions, job_id: str) -> int:
    with sessions() as session:
        return session.scalar(select(func.count()).select_from(JobMetric).where(JobMetric.job_id == job_id))


def _settings(database_url, tmp_path, **overrides) -> Settings:
    return Settings(database_url=database_url, storage=str(tmp_path / "storage"), var_dir=str(tmp_path), **overrides)


def test_history_retention_is_off_by_default(sessions, database_url, tmp_path):
    settings = _settings(database_url, tmp_path)
    assert settings.history_days is None
    old = _job(sessions, JobState.SUCCEEDED, ended_days_ago=3650)
    assert HistoryRetention(sessions, settings).tick() == 0
    assert _points(sessions, old) == POINTS


def test_ended_jobs_lose_their_old_metric_points_and_keep_the_rest(sessions, database_url, tmp_path):
    settings = _settings(database_url, tmp_path, history_days=30)
    old = {
        state: _job(sessions, state, ended_days_ago=40)
        for state in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)
    }
    recent = _job(sessions, JobState.SUCCEEDED, ended_days_ago=10)
    running = _job(sessions, JobState.RUNNING, ended_days_ago=None, started_days_ago=100)
    history = HistoryRetention(sessions, settings)

    assert history.tick() == 3 * POINTS
    assert [_points(sessions, j) for j in old.values()] == [0, 0, 0]
    assert _points(sessions, recent) == POINTS  # ended 10 days ago
    assert _points(sessions, running) == POINTS  # old points, but the job has not ended
    with sessions() as session:
        kept = session.get(Job, old[JobState.SUCCEEDED])
        assert kept.state == JobState.SUCCEEDED
        assert kept.latest_metrics == {"loss": 0.1, "step": POINTS}
        assert kept.result == {"val_accuracy": 0.97}
        assert session.scalar(select(func.count()).select_from(Checkpoint)) == 5
        assert session.scalar(select(func.count()).select_from(JobEvent)) == 5
    assert history.tick() == 0  # nothing left to do

    # 25 days on, the job that ended 10 days ago is 35 days gone: its points go too.
    assert history.tick(now=utcnow() + timedelta(days=25)) == POINTS
    assert _points(sessions, recent) == 0
    assert _points(sessions, running) == POINTS


def test_a_long_history_goes_in_bounded_batches(sessions, database_url, tmp_path, monkeypatch):
    monkeypatch.setattr(retention, "HISTORY_BATCH_JOBS", 2)
    monkeypatch.setattr(retention, "HISTORY_BATCHES_PER_TICK", 2)
    settings = _settings(database_url, tmp_path, history_days=7)
    jobs = [_job(sessions, JobState.SUCCEEDED, ended_days_ago=30 + i) for i in range(5)]
    history = HistoryRetention(sessions, settings)

    statements = []
    original = sessions.begin

    def counted_begin(*args, **kwargs):
        statements.append("begin")
        return original(*args, **kwargs)

    monkeypatch.setattr(sessions, "begin", counted_begin)
    assert history.tick() == 4 * POINTS  # two transactions of two jobs each
    assert len(statements) == 2
    assert sorted(_points(sessions, j) for j in jobs) == [0, 0, 0, 0, POINTS]
    assert _points(sessions, jobs[0]) == POINTS  # the oldest end went first; this one ended most recently
    assert history.tick() == POINTS
    assert history.tick() == 0


@pytest.mark.parametrize("storage_up", [True, False])
def test_the_retention_loop_applies_it_even_while_storage_is_away(
    sessions, database_url, tmp_path, monkeypatch, storage_up
):
    settings = _settings(database_url, tmp_path, history_days=1)
    old = _job(sessions, JobState.FAILED, ended_days_ago=2)
    storage = CheckpointStorage(settings.storage)
    monkeypatch.setattr(CheckpointStorage, "available", lambda self: storage_up)
    CheckpointJanitor(sessions, storage, settings).tick()
    assert _points(sessions, old) == 0


def test_the_setting_is_read_from_the_environment(monkeypatch):
    monkeypatch.setenv("ORCHESTRATOR_HISTORY_DAYS", "90")
    assert Settings().history_days == 90
    monkeypatch.setenv("ORCHESTRATOR_HISTORY_DAYS", "0")
    with pytest.raises(ValueError, match="greater than 0"):
        Settings()
