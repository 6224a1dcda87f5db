"""`orchestrator serve` with ORCHESTRATOR_API_WORKERS: several uvicorn workers are several replicas on one port,
so only on PostgreSQL with an existing Ray cluster; the schema and the bootstrap key are made once, before the
workers start (they would race otherwise). uvicorn itself is not started: what it is asked to run is checked."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select
from typer.testing import CliRunner

from orchestrator import cli
from orchestrator.db.engine import make_engine, make_session_factory
from orchestrator.db.models import ApiKey


@pytest.fixture
def served(monkeypatch, tmp_path, database_url):
    """Run `orchestrator serve` with the environment given; what uvicorn.run was called with (or None)."""
    calls = []
    monkeypatch.setattr(cli.uvicorn, "run", lambda app, **options: calls.append((app, options)))
    monkeypatch.setattr(cli, "configure_logging", lambda log_format: None)  # keep pytest's own log handlers
    monkeypatch.delenv("ORCHESTRATOR_ADMIN_TOKEN", raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("ORCHESTRATOR_DATABASE_URL", database_url)
    monkeypatch.setenv("ORCHESTRATOR_VAR_DIR", str(tmp_path / "var"))
    monkeypatch.setenv("ORCHESTRATOR_STORAGE", str(tmp_path / "storage"))

    def serve(**env):
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        result = CliRunner().invoke(cli.app, ["serve"])
        return result, (calls[-1] if calls else None)

    return serve


def test_one_worker_is_the_default(served):
    result, (app, options) = served()
    assert result.exit_code == 0, result.output
    assert app == "api.app:serve_app" and options["factory"] is True and options["workers"] == 1


def test_several_workers_need_postgresql_and_an_existing_ray_cluster(served, database_url):
    if database_url.startswith("sqlite"):
        result, call = served(ORCHESTRATOR_API_WORKERS="2", RAY_ADDRESS="http://head:8265")
        assert result.exit_code == 2 and call is None
        assert "needs PostgreSQL" in result.output and "ORCHESTRATOR_API_WORKERS=1" in result.output
        return
    result, call = served(ORCHESTRATOR_API_WORKERS="2")
    assert result.exit_code == 2 and call is None and "needs RAY_ADDRESS" in result.output

    result, (_, options) = served(ORCHESTRATOR_API_WORKERS="2", RAY_ADDRESS="http://head:8265")
    assert result.exit_code == 0, result.output
    assert options["workers"] == 2
    # Migrated, and the bootstrap admin key made and printed once, before any worker started.
    assert "No admin key existed" in result.output
    engine = make_engine(database_url)
    try:
        with make_session_factory(engine)() as session:
            assert session.scalar(select(func.count()).select_from(ApiKey).where(ApiKey.cluster_wide)) == 1
    finally:
        engine.dispose()
