"""One ClusterBackend per registered Ray cluster (docs/clusters.md), so that every call reaches the cluster a run
is placed on. Backends are built on first use from the cluster's row (its dashboard address and the token its
``token_ref`` names) and rebuilt when either changes; the default cluster's is the one the control plane
started or was given. No ray import here: ``connect`` builds a backend (``RayBackend`` in the service)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from orchestrator.backend import BackendUnavailable, ClusterBackend

Connect = Callable[[str, "str | None"], ClusterBackend]  # (dashboard address, token) -> backend


def read_token(token_ref: str | None) -> str | None:
    """The token a cluster's ``token_ref`` names: ``env:NAME`` (the control plane's environment) or ``file:/path``;
    None: the cluster takes no token. Raises BackendUnavailable when it names nothing there."""
    if not token_ref:
        return None
    kind, _, where = token_ref.partition(":")
    if kind == "env":
        value = os.environ.get(where, "").strip()
    elif kind == "file":
        path = Path(where)
        value = path.read_text().strip() if path.is_file() else ""
    else:
        raise BackendUnavailable(f"token_ref {token_ref!r} is neither env:NAME nor file:/path")
    if not value:
        raise BackendUnavailable(f"the cluster's token ({token_ref}) is not set where the control plane runs")
    return value


@dataclass(frozen=True)
class ClusterEntry:
    """What the registry knows of a cluster: enough to reach it and to place runs on it."""

    name: str
    address: str
    token_ref: str | None
    labels: dict = field(default_factory=dict)
    is_default: bool = False


class ClusterBackends:
    def __init__(
        self,
        sessions: sessionmaker[Session],
        connect: Connect,
        wrap: Callable[[ClusterBackend], ClusterBackend] = lambda backend: backend,
    ):
        self.sessions = sessions
        self.connect = connect
        self.wrap = wrap  # every backend counted the same way (MeteredBackend)
        self.default_name = ""
        self._default: ClusterBackend | None = None
        self._entries: dict[str, ClusterEntry] = {}
        self._built: dict[str, tuple[tuple[str, str | None], ClusterBackend]] = {}
        self._lock = threading.Lock()

    def set_default(self, name: str, backend: ClusterBackend) -> None:
        """The service's own cluster and the backend it already has for it (local, RAY_ADDRESS's or a test's)."""
        self.default_name, self._default = name, self.wrap(backend)

    @property
    def default(self) -> ClusterBackend:
        assert self._default is not None, "ControlPlane.start() sets the default cluster's backend"
        return self._default

    def refresh(self, session: Session | None = None) -> list[ClusterEntry]:
        """Re-read the registered clusters (their addresses, tokens and labels may have changed through the API on
        any replica): the loops call this once a tick."""
        from orchestrator.db.models import Cluster  # the ORM stays out of the backend package's import time

        def read(s: Session) -> list[ClusterEntry]:
            rows = s.scalars(select(Cluster).order_by(Cluster.name))
            return [ClusterEntry(r.name, r.address, r.token_ref, dict(r.labels or {}), r.is_default) for r in rows]

        if session is not None:
            entries = read(session)
        else:
            with self.sessions() as s:
                entries = read(s)
        with self._lock:
            self._entries = {e.name: e for e in entries}
        return entries

    def entries(self) -> list[ClusterEntry]:
        with self._lock:
            return list(self._entries.values())

    def get(self, name: str | None) -> ClusterBackend:
        """The backend of the cluster named ``name`` (None: the default cluster). Raises BackendUnavailable when no
        such cluster is registered or its token can't be read."""
        if name is None or name == self.default_name:
            return self.default
        with self._lock:
            entry = self._entries.get(name)
        if entry is None:
            entry = {e.name: e for e in self.refresh()}.get(name)
        if entry is None:
            raise BackendUnavailable(f"cluster {name!r} is not registered")
        token = read_token(entry.token_ref)
        key = (entry.address, token)
        with self._lock:
            built = self._built.get(name)
            if built is None or built[0] != key:
                built = (key, self.wrap(self.connect(entry.address, token)))
                self._built[name] = built
            return built[1]

    def of(self, run) -> ClusterBackend:
        """The backend of the cluster a job, sweep or deployment is placed on."""
        return self.get(getattr(run, "cluster", None))


def backends_of(
    backends: ClusterBackends | ClusterBackend, sessions: sessionmaker[Session], default_name: str = "local"
) -> ClusterBackends:
    """The loops take the registry; a lone backend (a test's fake, a bench) is the default cluster alone, under
    ``default_name`` (``Settings.cluster_name``, whose default is "local")."""
    if isinstance(backends, ClusterBackends):
        return backends
    single = ClusterBackends(sessions, _unreachable)
    single.set_default(default_name, backends)
    return single


def _unreachable(address: str, token: str | None) -> ClusterBackend:
    raise BackendUnavailable(f"this control plane was given one cluster's backend and cannot reach {address}")
