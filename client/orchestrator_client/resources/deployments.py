"""Deployments, by name: ``client.deployments`` and the ``Deployment`` it hands back (update, rollback,
delete, wait, and ``predict`` against its Serve URL)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

from pydantic import BaseModel

from orchestrator_client.paging import Pager
from orchestrator_client.resources.bound import Bound
from orchestrator_client.specs import load_spec
from orchestrator_client.transport import Transport, idempotency_headers
from orchestrator_client.waiting import poll_until
from orchestrator_contract.rest import DeploymentEventOut, DeploymentOut
from orchestrator_contract.states import DeploymentState

# A wait ends in these whatever it waits for: nothing changes them without a new request.
SETTLED_STATES = frozenset({DeploymentState.FAILED, DeploymentState.DELETED})


class Deployment(DeploymentOut, Bound):
    """A deployment (every field of ``DeploymentOut``) that can be updated, rolled back, deleted and called."""

    @property
    def _path(self) -> str:
        return f"/v1/deployments/{quote(self.name, safe='')}"

    def reload(self) -> Deployment:
        return self._refresh(self._http.request("GET", self._path).json())

    def update(self, changes: Mapping[str, Any] | BaseModel) -> Deployment:
        """A new version with ``changes`` (``source``, ``replicas``, ``batching``, ``resources``, ``auth``,
        ``max_body_mb``: a dict or a ``DeploymentPatch``), rolled out while the current one keeps serving."""
        body = load_spec(changes) if isinstance(changes, BaseModel) else dict(changes)
        return self._refresh(self._http.request("PATCH", self._path, json=body).json())

    def rollback(self) -> Deployment:
        """Back to the version before the newest (as a new version)."""
        return self._refresh(self._http.request("POST", f"{self._path}/rollback").json())

    def delete(self) -> Deployment:
        """DELETED now; Serve drops it within a reconciler tick."""
        return self._refresh(self._http.request("DELETE", self._path).json())

    def events(self, limit: int | None = None, page_size: int | None = None) -> Pager[DeploymentEventOut]:
        return Pager(
            self._http, f"{self._path}/events", DeploymentEventOut.model_validate, limit=limit, page_size=page_size
        )

    def wait(
        self,
        states: Collection[str] = (DeploymentState.HEALTHY,),
        timeout: float | None = None,
        poll: float = 1.0,
        on_change: Callable[[Deployment], None] | None = None,
    ) -> Deployment:
        """Until its state is one of ``states`` (HEALTHY counts once the newest version serves:
        ``serving_version == version``), or it is FAILED or DELETED (returned: check ``state``). Past
        ``timeout`` s: ``WaitTimeout``."""
        wanted = {str(state) for state in states}

        def done(deployment: Deployment) -> bool:
            if deployment.state in SETTLED_STATES:
                return True
            if deployment.state == DeploymentState.HEALTHY:
                return "HEALTHY" in wanted and deployment.serving_version == deployment.version
            return str(deployment.state) in wanted

        return poll_until(
            self,
            self.reload,
            done,
            timeout=timeout,
            poll=poll,
            what=lambda d: f"{d.state.value} (version {d.version}, serving {d.serving_version})",
            on_change=on_change,
            change_key=lambda d: (d.state, d.version, d.serving_version),
        )

    def predict(self, payload: Any, timeout: float | None = None) -> Any:
        """POST ``payload`` (JSON) to the deployment's URL and return the JSON answer; the client's key goes
        with it when the deployment's ``auth`` is ``project``. Never retried (a POST without a key)."""
        response = self._http.call_url(
            "POST", self.url, json=payload, with_token=self.auth == "project", timeout=timeout
        )
        try:
            return response.json()
        except ValueError:
            return response.text


class Deployments:
    """``client.deployments``."""

    def __init__(self, transport: Transport) -> None:
        self._http = transport

    def _deployment(self, data: Any) -> Deployment:
        return Deployment.bind(data, self._http)

    def create(
        self,
        spec: Mapping[str, Any] | BaseModel | str | Path,
        project_id: str | None = None,
        overrides: list[str] | tuple[str, ...] = (),
        idempotency_key: str | Literal[False] | None = None,
    ) -> Deployment:
        """Serve a checkpoint: ``spec`` is a ``DeploymentCreate`` as a dict, the model, or a spec file
        (``{"name": "digits", "source": {"job_id": "..."}}``). An ``Idempotency-Key`` goes with it (a fresh one
        unless given; ``False`` sends none), so a retried create answers the deployment, not "name taken"."""
        body = load_spec(spec, overrides)
        headers = idempotency_headers(idempotency_key)
        response = self._http.request(
            "POST", "/v1/deployments", json=body, headers=headers, params={"project_id": project_id}
        )
        return self._deployment(response.json())

    def get(self, name: str) -> Deployment:
        return self._deployment(self._http.request("GET", f"/v1/deployments/{quote(name, safe='')}").json())

    def list(
        self,
        state: str | list[str] | None = None,
        limit: int | None = None,
        page_size: int | None = None,
    ) -> Pager[Deployment]:
        """Newest first; by default every deployment but the DELETED ones."""
        states = state if isinstance(state, list | tuple) else [state] if state is not None else []
        params = [("state", str(s)) for s in states]
        return Pager(self._http, "/v1/deployments", self._deployment, params=params, limit=limit, page_size=page_size)
