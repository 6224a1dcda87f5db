"""Leader election on PostgreSQL (orchestrator/leader.py): one replica runs the loops, a frozen one is replaced, a
deposed one's writes are refused, a clean shutdown hands over at once; /readyz says who leads and keeps serving
with Ray down; on SQLite nothing changes."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, text

from api.app import create_app
from orchestrator.db.engine import make_engine, make_session_factory
from orchestrator.db.migrate import upgrade_head
from orchestrator.db.models import LeaderLease, Project
from orchestrator.leader import LeaseElector, NotLeader, fenced, install_fencing
from orchestrator.settings import Settings
from tests.conftest import _fresh_pg_database
from tests.fakes import FakeBackend
from tests.unit.api_helpers import ADMIN

# Generous: the machine is loaded. Only an upper bound far above the design's 2 x lease decides anything.
SLACK_S = 20


@pytest.fixture
def pg_url(postgres_server) -> Iterator[str]:
    yield from _fresh_pg_database(postgres_server)


@pytest.fixture
def engine(pg_url):
    engine = make_engine(pg_url)
    upgrade_head(engine)
    yield engine
    engine.dispose()


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def elector(engine, name: str, lease_s: float = 6.0, clock=time.monotonic) -> LeaseElector:
    made = LeaseElector(engine, lease_s, holder=name, clock=clock)
    made._ensure_row()
    return made


def expire_lease(engine) -> None:
    """What the passing of a whole lease without renewal does to the row (a frozen or killed leader)."""
    with engine.begin() as conn:
        conn.execute(text("UPDATE leader_leases SET expires_at = clock_timestamp() - interval '1 second'"))


def wait_until(predicate, timeout_s: float, what: str) -> float:
    started = time.monotonic()
    while not predicate():
        assert time.monotonic() - started < timeout_s, f"timed out after {timeout_s:.0f} s waiting for {what}"
        time.sleep(0.05)
    return time.monotonic() - started


def add_project(sessions, name: str, fence: LeaseElector | None) -> None:
    with fenced(fence), sessions.begin() as session:
        session.add(Project(name=name))


def project_names(sessions) -> set[str]:
    with sessions() as session:
        return set(session.scalars(select(Project.name)))


@pytest.mark.postgres
def test_of_two_electors_exactly_one_leads_and_a_frozen_leader_is_replaced_within_two_leases(engine):
    lease_s = 2.0
    first, second = elector(engine, "a", lease_s), elector(engine, "b", lease_s)
    try:
        first.start()
        second.start()
        time.sleep(lease_s)  # several rounds of renewals and tries
        wait_until(lambda: [first.is_leader, second.is_leader].count(True) == 1, SLACK_S, "one leader")
        leader, follower = (first, second) if first.is_leader else (second, first)
        old_token = leader.token

        leader.stop(release=False)  # frozen or killed: no renewal, no release
        wait_until(lambda: follower.is_leader, 2 * lease_s + SLACK_S, "the follower to take over")
        assert follower.token == old_token + 1  # the fencing token moved on
        # The frozen one stopped calling itself the leader before its lease ran out (2/3 of a lease after its
        # last renewal began), so it never ran its loops beside the new leader.
        assert not leader.is_leader
    finally:
        first.stop()
        second.stop()


@pytest.mark.postgres
def test_a_leader_that_cannot_renew_stops_leading_before_its_lease_expires(engine):
    clock = Clock()
    leader = elector(engine, "a", lease_s=30.0, clock=clock)
    assert leader.step() and leader.token == 1
    with engine.connect() as conn:
        left = conn.execute(
            text("SELECT extract(epoch FROM expires_at - clock_timestamp()) FROM leader_leases")
        ).scalar()
    assert 20 < left <= 30  # the row holds a whole lease from the renewal
    clock.now += 19.9  # no renewal for just under 2/3 of a lease: still leading
    assert leader.is_leader
    clock.now += 0.2  # 2/3 of a lease: it steps down on its own, with a third of the lease to spare
    assert not leader.is_leader and leader.token is None
    # and its loops' writes are refused, the database not even asked
    with pytest.raises(NotLeader), engine.connect() as conn:
        leader.check(conn)
    assert leader.step() and leader.token == 1  # a renewal that works again: nobody took it, same term


@pytest.mark.postgres
def test_a_deposed_leaders_loop_write_is_refused_by_the_fencing_token(engine):
    sessions = make_session_factory(engine)
    install_fencing(sessions)
    old = elector(engine, "old", lease_s=30.0)  # its own clock says it still leads for 20 s
    new = elector(engine, "new", lease_s=30.0)
    assert old.step() and not new.step()  # the lease is held: no takeover
    add_project(sessions, "while-leading", old)

    expire_lease(engine)  # the old leader froze past its lease
    assert new.step() and new.token == old.token + 1
    assert old.is_leader  # it does not know yet...
    with pytest.raises(NotLeader, match="deposed"):  # ...but the database refuses its write
        add_project(sessions, "after-deposed", old)
    add_project(sessions, "by-the-new-leader", new)
    add_project(sessions, "an-api-request", None)  # requests are never fenced: every replica serves writes
    assert project_names(sessions) >= {"while-leading", "by-the-new-leader", "an-api-request"}
    assert "after-deposed" not in project_names(sessions)  # rolled back
    old.step()  # its next renewal finds the row taken
    assert not old.is_leader


@pytest.mark.postgres
def test_a_takeover_waits_for_the_old_leaders_write_in_flight(engine):
    sessions = make_session_factory(engine)
    install_fencing(sessions)
    old, new = elector(engine, "old", lease_s=3.0), elector(engine, "new", lease_s=3.0)
    assert old.step()
    with fenced(old), sessions.begin() as session:
        session.add(Project(name="in-flight"))
        old.check(session.connection())  # the fenced check: the lease row share-locked until this commits
        expire_lease(engine)
        assert not new.step()  # the takeover waited (lock_timeout) and gave up: the old write is not overtaken
    assert "in-flight" in project_names(sessions)
    assert new.step() and new.token == 2
    with pytest.raises(NotLeader):
        add_project(sessions, "late", old)


@pytest.mark.postgres
def test_a_clean_shutdown_releases_the_lease_at_once(engine):
    leader, follower = elector(engine, "a", lease_s=30.0), elector(engine, "b", lease_s=30.0)
    leader.start()
    assert leader.is_leader
    leader.stop(release=True)
    with engine.connect() as conn:
        row = conn.execute(select(LeaderLease.holder, LeaderLease.token)).one()
    assert row.holder is None and row.token == 1  # free now, though the lease had 30 s left; the token stays
    assert follower.step() and follower.token == 2  # taken at the follower's next try, no expiry waited for


def make_app(database_url: str, tmp_path, name: str, **overrides):
    settings = Settings(
        database_url=database_url,
        storage=str(tmp_path / "storage"),
        var_dir=str(tmp_path / name),
        admin_token=ADMIN,
        workload_packages="allowed_pkg",
        **overrides,
    )
    return create_app(settings, backend=FakeBackend(), run_loops=True)


def leader_of(client: TestClient) -> bool:
    answer = client.get("/readyz")
    assert answer.status_code == 200, answer.text
    return answer.json()["leader"]


@pytest.mark.postgres
def test_two_control_planes_on_one_database_one_leads_and_the_other_takes_over(pg_url, tmp_path):
    lease_s = 2.0
    first = TestClient(make_app(pg_url, tmp_path, "a", lease_s=lease_s, scheduler_interval_s=0.2))
    second = TestClient(make_app(pg_url, tmp_path, "b", lease_s=lease_s, scheduler_interval_s=0.2))
    with first, second:
        wait_until(lambda: [leader_of(first), leader_of(second)].count(True) == 1, SLACK_S, "one leader")
        leads, follows = (first, second) if leader_of(first) else (second, first)
        assert leader_of(leads) and not leader_of(follows)
        # Both serve the API: a submission through the follower is stored (it queues for the leader's scheduler).
        made = follows.post("/v1/jobs", json={"workload": "digits"}, headers={"Authorization": f"Bearer {ADMIN}"})
        assert made.status_code == 201, made.text

        old = leads.app.state.service
        old.elector.stop(release=False)  # the leader freezes: its renewals stop, nothing is released
        wait_until(lambda: leader_of(follows), 2 * lease_s + SLACK_S, "the other replica to lead")
        assert not leader_of(leads)
        # The new leader's scheduler admits what was queued; the old one's loops no longer tick.
        job = made.json()["id"]
        wait_until(
            lambda: (
                follows.get(f"/v1/jobs/{job}", headers={"Authorization": f"Bearer {ADMIN}"}).json()["state"] != "QUEUED"
            ),
            SLACK_S,
            "the new leader to admit the job",
        )


@pytest.mark.postgres
def test_a_control_plane_that_stops_hands_the_lease_over(pg_url, tmp_path):
    first = TestClient(make_app(pg_url, tmp_path, "a", lease_s=30.0)).__enter__()
    try:
        assert leader_of(first)  # alone: it leads from its start
        with TestClient(make_app(pg_url, tmp_path, "b", lease_s=30.0)) as second:
            assert not leader_of(second)
            stopping, first = first, None
            stopping.__exit__(None, None, None)  # a clean shutdown (the lifespan's stop)
            # Its lease had ~30 s left; released, the other takes it at its next try (every lease/3 = 10 s).
            wait_until(lambda: leader_of(second), 10 + SLACK_S, "the other replica to lead")
    finally:
        if first is not None:
            first.__exit__(None, None, None)


def test_on_sqlite_the_one_process_leads_without_a_lease(tmp_path):
    url = f"sqlite:///{tmp_path / 'orchestrator.db'}"
    app = make_app(url, tmp_path, "a")
    with TestClient(app) as client:
        assert app.state.service.elector is None
        assert leader_of(client)
        engine = make_engine(url)
        with make_session_factory(engine)() as session:
            assert session.scalars(select(LeaderLease)).all() == []  # the table exists, unused
        engine.dispose()


def test_readyz_answers_200_while_only_ray_is_down(client, backend):
    backend.available = False
    answer = client.get("/readyz")
    assert answer.status_code == 200, answer.text  # the API still serves: history, logs, submissions
    assert answer.json()["database"] == "ok" and answer.json()["ray"] == "error: unavailable"
    assert isinstance(answer.json()["leader"], bool)
    queued = client.post("/v1/jobs", json={"workload": "digits"}, headers={"Authorization": f"Bearer {ADMIN}"})
    assert queued.status_code == 201 and queued.json()["state"] == "QUEUED"
