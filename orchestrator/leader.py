"""Leader election through the database: every replica serves the API, one runs the background loops.

PostgreSQL: a lease row (``leader_leases``, one per lease name) holds the leader's name, when its lease expires
(the database's clock) and a fencing token that grows by one at every change of holder. The leader renews every
lease/3; a replica takes the row over when it was released or has expired. Fencing: every commit a loop makes
(``fenced``) first reads the row ``FOR KEY SHARE`` in the same transaction and is refused (``NotLeader``: raised,
the transaction rolls back) unless the token is still this replica's. A takeover reads the row ``FOR UPDATE``,
which waits for those share locks: a deposed leader's write either committed before the new leader took over, or
it is refused. Renewals are plain UPDATEs of non-key columns, which do not wait for them.

A leader that cannot renew stops by itself: ``token`` is None once 2/3 of a lease has passed since the start of
its last renewal that succeeded (a monotonic clock, no database needed), while the row's expiry is at least a
whole lease after that start. So its loops stop ticking and its writes are refused a third of a lease before
anyone else may take over.

SQLite: one process, no election (``ControlPlane`` makes no elector and fences nothing).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.orm import Session, sessionmaker

log = logging.getLogger(__name__)

LOOPS_LEASE = "loops"  # the lease of the background loops; the row's name

_FENCE: ContextVar[LeaseElector | None] = ContextVar("orchestrator_fence", default=None)


class NotLeader(RuntimeError):
    """A loop's write from a replica that no longer holds the lease: refused, its transaction rolled back."""


@contextmanager
def fenced(elector: LeaseElector | None) -> Iterator[None]:
    """Every commit of a fenced session factory (``install_fencing``) inside this block checks ``elector``'s
    token first. ``None``: no check (SQLite, one process)."""
    reset = _FENCE.set(elector)
    try:
        yield
    finally:
        _FENCE.reset(reset)


def install_fencing(sessions: sessionmaker[Session]) -> None:
    """Fence the commits of ``sessions`` made inside ``fenced(...)`` (the loops' ticks); requests are not."""
    event.listen(sessions, "before_commit", _check_fence)


def _check_fence(session: Session) -> None:
    elector = _FENCE.get()
    if elector is not None:
        elector.check(session.connection())


class LeaseElector:
    """Holds, renews and releases one lease row on PostgreSQL, in a thread of its own (``start``/``stop``)."""

    def __init__(
        self,
        engine: Engine,
        lease_s: float,
        name: str = LOOPS_LEASE,
        holder: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.lease_s = lease_s
        self.name = name
        self.holder = holder or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.clock = clock
        # A connection of its own: a pool busy with requests must not make the leader miss its renewals.
        self.engine = create_engine(
            engine.url, pool_size=1, max_overflow=1, pool_pre_ping=True, pool_timeout=self.renew_every_s
        )
        self._lock = threading.Lock()
        self._token: int | None = None
        self._valid_until = 0.0  # on ``clock``: when this replica stops calling itself the leader
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def renew_every_s(self) -> float:
        return self.lease_s / 3

    @property
    def token(self) -> int | None:
        """The fencing token while this replica leads; None otherwise, and once its last renewal is too old."""
        with self._lock:
            if self._token is None or self.clock() >= self._valid_until:
                return None
            return self._token

    @property
    def is_leader(self) -> bool:
        return self.token is not None

    # --- the thread ---------------------------------------------------------------------------------------

    def start(self) -> None:
        """One try at once (a lone replica leads from its start), then a try or a renewal every lease/3."""
        self._ensure_row()
        self.step()
        self._thread = threading.Thread(target=self._run, name=f"lease-{self.name}", daemon=True)
        self._thread.start()

    def stop(self, release: bool = True) -> None:
        """Stop renewing; ``release`` hands the lease over at once (a clean shutdown, after the loops stopped).
        Without it the lease runs out as a killed process's would."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.lease_s)
        if release:
            self.release()
        self.engine.dispose()

    def _run(self) -> None:
        while not self._stop.wait(self.renew_every_s):
            self.step()

    def step(self) -> bool:
        """Renew the lease this replica holds, or try to take a free or expired one; whether it leads now."""
        began = self.clock()
        with self._lock:
            held = self._token
        try:
            token = self._renew(held) if held is not None else self._acquire()
        except Exception as exc:  # the database is away, or another replica holds the row locked
            if held is not None:
                log.warning(
                    "could not renew the %s lease (%s); still the leader for %.1f s at most",
                    self.name,
                    exc,
                    max(0.0, self._valid_until - self.clock()),
                )
            else:
                log.debug("could not try the %s lease: %s", self.name, exc)
            return self.is_leader
        with self._lock:
            self._token = token
            if token is not None:
                # The row now expires a whole lease after ``began`` or later; stop a third of a lease before.
                self._valid_until = began + self.lease_s * 2 / 3
        if token is not None and held is None:
            log.warning("this replica (%s) leads: it runs the background loops (fencing token %d)", self.holder, token)
        elif token is None and held is not None:
            log.warning("this replica (%s) lost the %s lease: its loops stop", self.holder, self.name)
        return token is not None

    # --- the row ------------------------------------------------------------------------------------------

    def _ensure_row(self) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                text("INSERT INTO leader_leases (name, token) VALUES (:name, 0) ON CONFLICT (name) DO NOTHING"),
                {"name": self.name},
            )

    def _bounded(self, conn: Connection) -> None:
        # Never wait on a lock or a statement past the time this replica may still lead.
        ms = max(50, int(self.lease_s * 1000 / 6))
        conn.exec_driver_sql(f"SET LOCAL lock_timeout = {ms}")
        conn.exec_driver_sql(f"SET LOCAL statement_timeout = {2 * ms}")

    def _renew(self, token: int) -> int | None:
        with self.engine.begin() as conn:
            self._bounded(conn)
            renewed = conn.execute(
                text(
                    "UPDATE leader_leases SET expires_at = clock_timestamp() + make_interval(secs => :lease) "
                    "WHERE name = :name AND holder = :holder AND token = :token"
                ),
                {"lease": self.lease_s, "name": self.name, "holder": self.holder, "token": token},
            )
            return token if renewed.rowcount == 1 else None

    def _acquire(self) -> int | None:
        free = "holder IS NULL OR expires_at IS NULL OR expires_at <= clock_timestamp()"
        with self.engine.begin() as conn:
            self._bounded(conn)
            # A look without a lock first: a follower's tries must not hold up the leader's fenced writes.
            if not conn.execute(
                text(f"SELECT {free} FROM leader_leases WHERE name = :name"), {"name": self.name}
            ).scalar():
                return None
            # FOR UPDATE waits for every fenced write of the old leader in flight (they hold FOR KEY SHARE).
            if not conn.execute(
                text(f"SELECT {free} FROM leader_leases WHERE name = :name FOR UPDATE"), {"name": self.name}
            ).scalar():
                return None
            return conn.execute(
                text(
                    "UPDATE leader_leases SET holder = :holder, token = token + 1, acquired_at = clock_timestamp(), "
                    "expires_at = clock_timestamp() + make_interval(secs => :lease) WHERE name = :name RETURNING token"
                ),
                {"holder": self.holder, "lease": self.lease_s, "name": self.name},
            ).scalar_one()

    def release(self) -> None:
        """Give the lease up at once (its token stays: the next holder's is greater)."""
        with self._lock:
            token, self._token = self._token, None
        if token is None:
            return
        try:
            with self.engine.begin() as conn:
                self._bounded(conn)
                conn.execute(
                    text(
                        "UPDATE leader_leases SET holder = NULL, expires_at = clock_timestamp() "
                        "WHERE name = :name AND holder = :holder AND token = :token"
                    ),
                    {"name": self.name, "holder": self.holder, "token": token},
                )
            log.info("released the %s lease", self.name)
        except Exception as exc:
            log.warning("could not release the %s lease (%s): it runs out within %.1f s", self.name, exc, self.lease_s)

    # --- fencing ------------------------------------------------------------------------------------------

    def check(self, connection: Connection) -> None:
        """Raise ``NotLeader`` unless this replica's token is still the current one. In the caller's transaction:
        the share lock it takes holds a takeover back until that transaction ends."""
        token = self.token
        if token is None:
            raise NotLeader(f"this replica ({self.holder}) does not hold the {self.name} lease: the write is refused")
        row = connection.execute(
            text("SELECT holder, token FROM leader_leases WHERE name = :name FOR KEY SHARE"), {"name": self.name}
        ).one_or_none()
        if row is None or row.holder != self.holder or row.token != token:
            raise NotLeader(
                f"this replica ({self.holder}, token {token}) was deposed"
                f"{f' by {row.holder} (token {row.token})' if row is not None else ''}: the write is refused"
            )
