"""The security tests run over the unit tests' app (a fake cluster, SQLite and PostgreSQL): the same
fixtures, reused from ``tests/unit/conftest.py`` (``database_url`` comes from ``tests/conftest.py``)."""

from __future__ import annotations

from tests.unit.conftest import app, backend, client, settings_overrides  # noqa: F401
