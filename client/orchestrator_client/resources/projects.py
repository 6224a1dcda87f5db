"""Projects (tenants) and their API keys: ``client.projects`` and ``client.projects.keys(project_id)``.
Creating projects and setting their limits is for cluster-wide admins; a project's admin key manages its keys."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from orchestrator_client.paging import Pager
from orchestrator_client.transport import Transport
from orchestrator_contract.rest import KeyCreated, KeyOut, ProjectOut


class Keys:
    """``client.projects.keys(project_id)``: one project's API keys."""

    def __init__(self, transport: Transport, project_id: str) -> None:
        self._http = transport
        self.project_id = project_id

    def create(
        self,
        role: str,
        name: str = "",
        expires_in_days: int | None = None,
        expires_at: datetime | None = None,
    ) -> KeyCreated:
        """A new key (admin, member or viewer); its secret (``.key``) is in this answer only."""
        body: dict[str, Any] = {"role": role, "name": name}
        if expires_in_days is not None:
            body["expires_in_days"] = expires_in_days
        if expires_at is not None:
            body["expires_at"] = expires_at.isoformat()
        response = self._http.request("POST", f"/v1/projects/{self.project_id}/keys", json=body)
        return KeyCreated.model_validate(response.json())

    def list(self, limit: int | None = None, page_size: int | None = None) -> Pager[KeyOut]:
        """The project's keys, oldest first (never their secrets)."""
        return Pager(
            self._http,
            f"/v1/projects/{self.project_id}/keys",
            KeyOut.model_validate,
            limit=limit,
            page_size=page_size,
        )

    def revoke(self, key_id: str) -> None:
        """The key answers 401 from the next request on."""
        self._http.request("DELETE", f"/v1/projects/{self.project_id}/keys/{key_id}")


class Projects:
    """``client.projects``."""

    def __init__(self, transport: Transport) -> None:
        self._http = transport

    def create(self, name: str, max_priority: int | None = None) -> ProjectOut:
        body: dict[str, Any] = {"name": name}
        if max_priority is not None:
            body["max_priority"] = max_priority
        return ProjectOut.model_validate(self._http.request("POST", "/v1/projects", json=body).json())

    def get(self, project_id: str) -> ProjectOut:
        return ProjectOut.model_validate(self._http.request("GET", f"/v1/projects/{project_id}").json())

    def list(self, limit: int | None = None, page_size: int | None = None) -> Pager[ProjectOut]:
        """Every project for a cluster-wide admin; the key's own project for any other key."""
        return Pager(self._http, "/v1/projects", ProjectOut.model_validate, limit=limit, page_size=page_size)

    def update(self, project_id: str, **limits: Any) -> ProjectOut:
        """Set limits (``max_priority=...``; ``max_priority=None`` lifts the cap)."""
        response = self._http.request("PATCH", f"/v1/projects/{project_id}", json=limits)
        return ProjectOut.model_validate(response.json())

    def set_quota(self, project_id: str, **quota: Any) -> ProjectOut:
        """Replace the project's quota (cluster-wide admins): ``max_cpus``, ``max_gpus``, ``max_running_jobs``,
        ``max_queued``, ``weight``, ``borrowing``, ``per_cluster`` (caps on single clusters, docs/clusters.md); one
        left out goes back to its default (docs/scheduling.md)."""
        # A wrong name or value is the server's 422 (an Invalid naming the field), as for every other call.
        response = self._http.request("PUT", f"/v1/projects/{project_id}/quota", json=quota)
        return ProjectOut.model_validate(response.json())

    def keys(self, project_id: str) -> Keys:
        return Keys(self._http, project_id)
