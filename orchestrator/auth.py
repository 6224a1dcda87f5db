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
    """Who is calling. ``project_id`` is None only for the environment's admin token.

    A key made under a project acts in that project only, whatever its role (``project_scope()``). Only
    a cluster-wide admin (the ORCHESTRATOR_ADMIN_TOKEN, or the key the first start prints without one)
    reaches every project and makes projects.
    """

    role: Role
    project_id: str | None
    key_id: str | None = None
    cluster_wide: bool = False

    @property
    def is_admin(self) -> bool:
        """Administers its project (keys); a cluster-wide admin administers every project."""
        return self.role == Role.ADMIN

    @property
    def is_cluster_admin(self) -> bool:
        return self.cluster_wide and self.is_admin

    @property
    def can_write(self) -> bool:
        return self.role in (Role.ADMIN, Role.MEMBER)

    def project_scope(self) -> str | None:
        """The project this caller is confined to; None means every project (cluster-wide admins only)."""
        return None if self.is_cluster_admin else self.project_id
