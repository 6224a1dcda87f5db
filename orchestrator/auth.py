"""API keys: generation, hashing, and who a presented key belongs to."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

from orchestrator.db.models import Role

KEY_PREFIX = "ork_"


def generate_secret(prefix: str = KEY_PREFIX) -> str:
    return prefix + secrets.token_urlsafe(32)


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def secrets_equal(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())


@dataclass(frozen=True)
class Principal:
    """Who is calling. ``project_id`` is None only for the bootstrap admin token."""

    role: Role
    project_id: str | None
    key_id: str | None = None

    @property
    def is_admin(self) -> bool:
        return self.role == Role.ADMIN

    @property
    def can_write(self) -> bool:
        return self.role in (Role.ADMIN, Role.MEMBER)

    def project_scope(self) -> str | None:
        """The project this caller is confined to; None means every project (admins)."""
        return None if self.is_admin else self.project_id
