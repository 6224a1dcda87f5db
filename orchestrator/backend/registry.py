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


TOKEN_ENV_PREFIX = "RAY_TOKEN_"  # the Helm chart's RAY_TOKEN_<NAME>; no other variable of the control plane


def token_ref_problem(token_ref: str | None, token_dir: str) -> str | None:
    """Why a registered cluster may not use ``token_ref``, or None. The control plane sends the token to the address
    an admin key chose, so ``env:`` may name only ``RAY_TOKEN_*`` variables and ``file:`` only a file inside
    ``token_dir`` (``Settings.cluster_token_dir``; resolved, links followed): never its database URL, its own key
    material or any other file of its machine."""
    if not token_ref:
        return None
    kind, _, where = token_ref.partition(":")
    if kind == "env":
        if where.startswith(TOKEN_ENV_PREFIX) and len(where) > len(TOKEN_ENV_PREFIX):
            return None
        return (
            f"token_ref env:{where} is not allowed: a cluster's token variable must be named {TOKEN_ENV_PREFIX}<NAME>"
        )
    if kind == "file":
        root, path = (Path(token_dir).resolve() if token_dir else None), Path(where).resolve()
        if root is not None and path != root and path.is_relative_to(root):
            return None
        return (
            f"token_ref file:{where} is not allowed: a cluster's token file must be inside {token_dir or '(none set)'} "
            "(ORCHESTRATOR_CLUSTER_TOKEN_DIR; links are followed)"
        )
    return f"token_ref {token_ref!r} is neither env:NAME nor file:/path"


def read_token(token_ref: str | None, token_dir: str) -> str | None:
    """The token a registered cluster's ``token_ref`` names (None: the cluster takes no token). Raises
    BackendUnavailable when the ref is not allowed (``token_ref_problem``) or names nothing there."""
    if not token_ref:
        return None
    problem = token_ref_problem(token_ref, token_dir)
    if problem:
        raise BackendUnavailable(problem)
    kind, _, where = token_ref.partition(":")
    if kind == "env":
        value = os.environ.get(where, "").strip()
    else:
        path = Path(where).resolve()
        value = path.read_text().strip() if path.is_file() else ""
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
    storage_root: str | None = None  # where its runs' folders are (None: the service's own storage)
    serve_port: int | None = None  # its Serve proxy's port (None: ORCHESTRATOR_SERVE_PORT)


class ClusterBackends:
    def __init__(
        self,
        sessions: sessionmaker[Session],
        connect: Connect,
        wrap: Callable[[ClusterBackend], ClusterBackend] = lambda backend: backend,
        token_dir: str = "",
    ):
        self.sessions = sessions
        self.connect = connect
        self.token_dir = token_dir  # where file: token refs may point (Settings.cluster_token_dir)
        self.wrap = wrap  # every backend counted the same way (MeteredBackend)
        self.default_name = ""
        self._default: ClusterBackend | None = None
        self._entries: dict[str, ClusterEntry] = {}
        self._tokens: dict[str, str | BackendUnavailable | None] = {}  # read at refresh: once a tick, not per call
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
            return [
                ClusterEntry(
                    r.name, r.address, r.token_ref, dict(r.labels or {}), r.is_default, r.storage_root, r.serve_port
                )
                for r in rows
            ]

        if session is not None:
            entries = read(session)
        else:
            with self.sessions() as s:
                entries = read(s)
        tokens: dict[str, str | BackendUnavailable | None] = {}
        for entry in entries:
            if entry.name == self.default_name:
                continue  # the service's own backend, built from its settings
            try:
                tokens[entry.name] = read_token(entry.token_ref, self.token_dir)
            except (BackendUnavailable, OSError) as exc:
                tokens[entry.name] = BackendUnavailable(f"cluster {entry.name!r}: {exc}")
        with self._lock:
            self._entries = {e.name: e for e in entries}
            self._tokens = tokens
        return entries

    def entries(self) -> list[ClusterEntry]:
        with self._lock:
            return list(self._entries.values())

    def storage_root(self, name: str, session: Session | None = None) -> str | None:
        """The registered ``storage_root`` of the cluster ``name`` (None: none, or no such cluster). A name not seen
        yet is looked up in ``session`` when one is open: on SQLite a second session of the same thread would wait
        for the first one's lock."""
        with self._lock:
            entry = self._entries.get(name)
        if entry is None:
            entry = {e.name: e for e in self.refresh(session)}.get(name)
        return entry.storage_root if entry is not None else None

    def get(self, name: str | None, session: Session | None = None) -> ClusterBackend:
        """The backend of the cluster named ``name`` (None: the default cluster). Raises BackendUnavailable when no
        such cluster is registered or its token can't be read. ``session``: the caller's open one, where the
        registry reads a name it has not seen (on SQLite a second session of one thread waits for the first's lock)."""
        if name is None or name == self.default_name:
            return self.default
        with self._lock:
            entry = self._entries.get(name)
        if entry is None:
            entry = {e.name: e for e in self.refresh(session)}.get(name)
        if entry is None:
            raise BackendUnavailable(f"cluster {name!r} is not registered")
        with self._lock:
            token = self._tokens.get(name)
        if isinstance(token, BackendUnavailable):
            raise BackendUnavailable(str(token))
        key = (entry.address, token)
        with self._lock:
            built = self._built.get(name)
            if built is None or built[0] != key:
                built = (key, self.wrap(self.connect(entry.address, token)))
                self._built[name] = built
            return built[1]

    def of(self, run, session: Session | None = None) -> ClusterBackend:
        """The backend of the cluster a job, sweep or deployment is placed on (``session``: as for ``get``)."""
        return self.get(getattr(run, "cluster", None), session)


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
