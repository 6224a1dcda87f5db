"""A short in-process memory of valid API keys, so a request need not look its key up in the database.

Keyed by the key's SHA-256 (what ``api_keys.key_hash`` stores), never by the key itself. Only a key that was
found, unexpired, enters; an unknown key is never remembered (a guesser sends a new key each time, so a memory
of failures would save nothing, and it would make a key made on another replica 401 for a while).

An entry is used for ``ttl_s`` seconds at most, and not at all once:
- the key's ``expires_at`` has passed (checked on every use, so expiry is exact);
- its ``last_used_at`` is older than ``LAST_USED_RESOLUTION``: the next request then takes the database path,
  which records the use, so ``last_used_at`` stays accurate to a minute as without the cache;
- the key was revoked through this process (``forget``). A lookup that started before a revoke never
  enters afterwards (``generation``), so a revoke cannot be undone by a request that was in flight.

A revoke through ANOTHER process (another replica, another uvicorn worker) is seen here within ``ttl_s``: the
trade-off documented in docs/security.md (ORCHESTRATOR_API_KEY_CACHE_S; 0 turns the memory off).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from orchestrator.auth import Principal
from orchestrator.repositories.projects import LAST_USED_RESOLUTION

MAX_ENTRIES = 10_000  # only valid keys enter, so this bounds memory, not an attacker's reach


@dataclass(frozen=True)
class _Entry:
    principal: Principal
    expires_at: datetime | None
    last_used_at: datetime | None  # as the database has it after this process's lookup (and write)
    until: float  # monotonic time after which the entry is not used


class KeyCache:
    def __init__(
        self, ttl_s: float, max_entries: int = MAX_ENTRIES, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._clock = clock
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._lock = threading.Lock()  # sync routes run in a thread pool
        self.generation = 0  # bumped by every forget/clear: read it before a lookup, hand it to put

    @property
    def enabled(self) -> bool:
        return self.ttl_s > 0

    def get(self, key_hash: str, now: datetime) -> Principal | None:
        """The principal of a key remembered and still good to use at ``now`` (UTC), else None."""
        entry = self._entries.get(key_hash)
        if entry is None:
            return None
        if (
            self._clock() >= entry.until
            or (entry.expires_at is not None and entry.expires_at <= now)
            or entry.last_used_at is None
            or entry.last_used_at <= now - LAST_USED_RESOLUTION
        ):
            with self._lock:
                if self._entries.get(key_hash) is entry:
                    del self._entries[key_hash]
            return None
        return entry.principal

    def put(
        self,
        key_hash: str,
        principal: Principal,
        expires_at: datetime | None,
        last_used_at: datetime | None,
        generation: int,
    ) -> None:
        """Remember a key just found valid, unless a revoke happened since ``generation`` was read."""
        if not self.enabled:
            return
        entry = _Entry(principal, expires_at, last_used_at, self._clock() + self.ttl_s)
        with self._lock:
            if generation != self.generation:
                return
            self._entries[key_hash] = entry
            self._entries.move_to_end(key_hash)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def forget(self, key_id: str) -> None:
        """The key ``key_id`` was revoked: its next request goes to the database (and is refused)."""
        with self._lock:
            self.generation += 1
            for key_hash in [h for h, e in self._entries.items() if e.principal.key_id == key_id]:
                del self._entries[key_hash]

    def clear(self) -> None:
        with self._lock:
            self.generation += 1
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)
