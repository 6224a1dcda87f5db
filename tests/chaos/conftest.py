"""The real service in a subprocess with its own local Ray cluster, and a failure-free reference run.

One service (and so one Ray head) serves the scenarios that leave the cluster standing; a scenario that
kills the head gets a service of its own. After each scenario nothing of it may run into the next.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

pytest.register_assert_rewrite("tests.chaos.recovery")

from tests.chaos.harness import TERMINAL, ServiceProcess  # noqa: E402
from tests.chaos.recovery import CHECKPOINT_INTERVAL, spec, steps_by_attempt, wait_storage_matches_db  # noqa: E402
from tests.conftest import _fresh_pg_database  # noqa: E402


@pytest.fixture(scope="session")
def shared_service(tmp_path_factory) -> Iterator[ServiceProcess]:
    svc = ServiceProcess(tmp_path_factory.mktemp("chaos-service"))
    svc.start()
    try:
        yield svc
    finally:
        svc.stop()


# PostgreSQL: a short lease, so that a restarted service leads (and adopts) soon after a kill -9 of the last one.
PG_SETTINGS = {"ORCHESTRATOR_LEASE_S": "3"}

# A scenario that production's database must pass too: ``@on_both_databases`` runs it on SQLite and on PostgreSQL.
on_both_databases = pytest.mark.parametrize(
    "service", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)


def finish_scenario(svc: ServiceProcess) -> None:
    """Running again, with no job of the scenario left on its cluster."""
    if svc.process.poll() is not None:  # a scenario failed between a kill and its restart
        svc.start()
    api = svc.api()
    for job in api.jobs():
        if job["state"] not in TERMINAL and job["state"] != "CANCELLING":
            api.http.post(f"/v1/jobs/{job['id']}/cancel")
    deadline = time.monotonic() + 60
    while any(job["state"] not in TERMINAL for job in api.jobs()) and time.monotonic() < deadline:
        time.sleep(0.5)


@contextmanager
def on_postgres(svc: ServiceProcess, admin_url: str, settings: dict[str, str] | None = None) -> Iterator[str]:
    """The shared service on a fresh PostgreSQL database (its Ray head adopted, not restarted) for the block;
    then back on its SQLite file, and the database dropped. Yields the database's URL."""
    databases = _fresh_pg_database(admin_url)
    url = next(databases)
    try:
        svc.switch(url, {**PG_SETTINGS, **(settings or {})})
        yield url
    finally:
        try:
            finish_scenario(svc)  # nothing of the scenario may run on into the next, whose database knows it not
        finally:
            svc.switch(None)
            databases.close()  # drops it


@pytest.fixture
def service(request, shared_service) -> Iterator[ServiceProcess]:
    """The shared service, running; afterwards no job of the scenario is left on its cluster. Parametrized
    indirectly (``on_both_databases``): "postgres" runs the scenario on a fresh PostgreSQL database."""
    if shared_service.process.poll() is not None:  # a scenario failed between a kill and its restart
        shared_service.start()
    if getattr(request, "param", "sqlite") == "postgres":
        with on_postgres(shared_service, request.getfixturevalue("postgres_server")):
            yield shared_service
        return
    yield shared_service
    finish_scenario(shared_service)


def pytest_collection_modifyitems(items):
    """Scenarios with a cluster of their own run last: they stop the shared one (below)."""
    items.sort(key=lambda item: "no_shared_cluster" in getattr(item, "fixturenames", ()))


@pytest.fixture
def no_shared_cluster(shared_service) -> None:
    """Stop the shared service and its cluster, for a scenario that starts a cluster of its own.

    Two local clusters on 2 cores slow each other down, and a second cluster that shares a fixed port
    with the first (Ray's dashboard agent listens on 52365 unless told otherwise) has a Jobs API that
    only answers "No available agent to submit job". A later scenario that asks for ``service`` starts
    the shared one again; scenarios that use this fixture are sorted to the end so that none does.
    """
    shared_service.stop()


@pytest.fixture
def own_service(no_shared_cluster, tmp_path) -> Iterator[ServiceProcess]:
    """A service and cluster for this scenario alone (it breaks the cluster itself)."""
    svc = ServiceProcess(tmp_path / "service")
    svc.start()
    try:
        yield svc
    finally:
        svc.stop()


@pytest.fixture(scope="session")
def reference(shared_service) -> dict:
    """The scenarios' job run once without failures: its final metrics and step count."""
    if shared_service.process.poll() is not None:  # stopped by ``no_shared_cluster``
        shared_service.start()
    api = shared_service.api()
    job = api.submit(spec("reference"))
    job = api.wait(job["id"], {"SUCCEEDED"}, timeout_s=300)
    steps = steps_by_attempt(api.metrics(job["id"]))
    total = job["result"]["metrics"]["step"]
    # The reference itself is what a run without failures looks like.
    assert list(steps) == [1] and steps[1] == list(range(1, total + 1)), steps
    assert total > 3 * CHECKPOINT_INTERVAL
    wait_storage_matches_db(shared_service, api, job["id"])
    return {"metrics": job["result"]["metrics"], "steps": total, "job_id": job["id"]}
