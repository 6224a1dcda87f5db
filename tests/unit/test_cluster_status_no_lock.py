"""GET /v1/cluster and the dashboard's cluster page ask each cluster's Ray with no database transaction open: on SQLite an open one holds the write
lock (the engine begins with BEGIN IMMEDIATE), so every writer (the scheduler, the runs' events, the other API
calls) would wait for the slowest cluster to answer. SQLite only: PostgreSQL's readers lock no writer out."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator

import pytest

from orchestrator.backend import ClusterNode, RayJob
from tests.fakes import FakeBackend
from tests.unit.api_helpers import ADMIN, auth, make_project
from tests.unit.ui_helpers import signed_in


class WriteProbingBackend(FakeBackend):
    """Ray, as seen while the request asks it: can another connection write to the database right now?"""

    def __init__(self, database_path: str):
        super().__init__()
        self.database_path = database_path
        self.writable_while_asked: list[bool] = []

    def live_jobs(self) -> list[RayJob]:
        self._probe()
        return super().live_jobs()

    def nodes(self) -> list[ClusterNode]:
        self._probe()
        return super().nodes()

    def _probe(self) -> None:
        connection = sqlite3.connect(self.database_path, timeout=0.2, isolation_level=None)
        try:
            connection.execute("BEGIN IMMEDIATE")
            connection.execute("ROLLBACK")
            self.writable_while_asked.append(True)
        except sqlite3.OperationalError:  # "database is locked": the request's transaction holds it
            self.writable_while_asked.append(False)
        finally:
            connection.close()


@pytest.fixture
def database_url(tmp_path) -> Iterator[str]:
    yield f"sqlite:///{tmp_path / 'orchestrator.db'}"


@pytest.fixture
def backend(tmp_path) -> WriteProbingBackend:
    return WriteProbingBackend(str(tmp_path / "orchestrator.db"))


@pytest.mark.parametrize("caller", ["admin", "member"])
def test_ray_is_asked_while_another_connection_may_write(app, client, backend, caller):
    _, keys = make_project(client, "vision")
    key = ADMIN if caller == "admin" else keys["member"]
    response = client.get("/v1/cluster", headers=auth(key))
    assert response.status_code == 200, response.text
    assert response.json()["jobs"] is not None and response.json()["clusters"][0]["ray"] == "ok"
    assert backend.writable_while_asked and all(backend.writable_while_asked), backend.writable_while_asked


def test_the_dashboards_cluster_page_asks_ray_while_another_connection_may_write(app, client, backend):
    _, keys = make_project(client, "vision")
    page = signed_in(client, keys["member"]).get("/ui/api/cluster")
    assert page.status_code == 200 and page.json()["nodes"], page.text
    assert len(backend.writable_while_asked) >= 3  # live_jobs, nodes for the status, nodes for the node table
    assert all(backend.writable_while_asked), backend.writable_while_asked
