"""The unit tests' app over a fake cluster; the helpers that drive it are in ``tests.unit.api_helpers``."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from orchestrator.db.engine import make_engine, make_session_factory
from orchestrator.db.migrate import upgrade_head
from orchestrator.settings import Settings
from tests.fakes import FakeBackend
from tests.unit.api_helpers import ADMIN


@pytest.fixture
def sessions(database_url):
    """A session factory over a migrated database (SQLite and PostgreSQL), for tests below the API."""
    engine = make_engine(database_url)
    upgrade_head(engine)
    yield make_session_factory(engine)
    engine.dispose()


@pytest.fixture
def backend() -> FakeBackend:
    return FakeBackend()


@pytest.fixture
def settings_overrides() -> dict:
    """What a test module changes in the app's Settings: override this fixture in the module."""
    return {}


@pytest.fixture
def app(database_url, tmp_path, backend, settings_overrides):
    settings = Settings(
        **{
            "database_url": database_url,
            "storage": str(tmp_path / "storage"),
            "var_dir": str(tmp_path / "var"),
            "admin_token": ADMIN,
            "workload_packages": "allowed_pkg",
            **settings_overrides,
        }
    )
    application = create_app(settings, backend=backend, run_loops=False)
    with TestClient(application) as client:
        application.state.client = client
        yield application


@pytest.fixture
def client(app) -> TestClient:
    return app.state.client


@pytest.fixture
def live(tmp_path, backend, settings_overrides):
    """The unit-test app over real HTTP (uvicorn in a thread, SQLite): what the SDK and CLI tests talk to."""
    from tests.unit.live_server import serve

    with serve(tmp_path, backend, **settings_overrides) as server:
        yield server
