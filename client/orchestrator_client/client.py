"""``Client``: the SDK's entry point. It resolves where to connect (``orchestrator_client.config``), holds one
HTTP connection pool (``orchestrator_client.transport``) and the API groups (``client.jobs``...)."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from urllib.parse import quote

import httpx
from pydantic import BaseModel

from orchestrator_client.config import resolve
from orchestrator_client.resources.code import CodePackages
from orchestrator_client.resources.deployments import Deployments
from orchestrator_client.resources.jobs import Jobs
from orchestrator_client.resources.projects import Projects
from orchestrator_client.resources.sweeps import Sweeps, Trials
from orchestrator_client.transport import Transport
from orchestrator_contract.rest import ClusterStatus, PlanRequest, PlanResponse, UsageReport, WhoAmI


class Client:
    """``Client(url=None, token=None, profile=None, timeout=30.0, retries=4)``.

    url and token: the arguments, else ``ORCHESTRATOR_URL`` / ``ORCHESTRATOR_TOKEN``, else the profile
    (``profile``, ``ORCHESTRATOR_PROFILE``, or the config file's default) that ``orch login`` saved; no url at
    all: http://127.0.0.1:8000. ``retries``: extra tries of an idempotent call (0: none). Close it when done
    (``with Client() as client:``)."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        profile: str | None = None,
        timeout: float = 30.0,
        retries: int = 4,
        *,
        http_transport: httpx.BaseTransport | None = None,
        backoff: float = 0.5,
    ) -> None:
        resolved = resolve(url, token, profile)
        self.url = resolved.url
        self.token = resolved.token
        self.profile = resolved.profile
        self.transport = Transport(
            self.url, self.token, timeout=timeout, retries=retries, backoff=backoff, http_transport=http_transport
        )
        self.jobs = Jobs(self.transport)
        self.sweeps = Sweeps(self.transport)
        self.trials = Trials(self.transport)
        self.deployments = Deployments(self.transport)
        self.code = CodePackages(self.transport)
        self.projects = Projects(self.transport)

    def __repr__(self) -> str:
        return f"Client(url={self.url!r}, profile={self.profile!r})"

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.transport.close()

    def whoami(self) -> WhoAmI:
        """The key this client uses: its id, name, role and project, and whether it is a cluster-wide admin."""
        return WhoAmI.model_validate(self.transport.request("GET", "/v1/whoami").json())

    def cluster(self) -> ClusterStatus:
        """The cluster's resources (total, available), the key's jobs per state, and the queue with reasons."""
        return ClusterStatus.model_validate(self.transport.request("GET", "/v1/cluster").json())

    def clear_bad_node(self, node_id: str) -> None:
        """Put a bad node (``cluster().bad_nodes``) back into placement: its faults are marked cleared. A cluster-wide
        admin's call; a node with nothing to clear raises NotFound."""
        self.transport.request("DELETE", f"/v1/cluster/bad-nodes/{quote(node_id, safe='')}")

    def usage(
        self,
        *,
        project_id: str | None = None,
        start: datetime | str | None = None,
        end: datetime | str | None = None,
        group_by: str = "project",
        csv: bool = False,
    ) -> UsageReport | str:
        """What runs held (``GET /v1/usage``): CPU-, GPU- and memory-GB-seconds and wasted time in [start, end)
        (defaults: the last 30 days), grouped by ``project``, ``job``, ``label:<key>`` or ``day``. A project's key
        sees its own project; a cluster-wide admin every project, or ``project_id``. ``csv=True``: the CSV text."""
        params = {
            "project_id": project_id,
            "from": start.isoformat() if isinstance(start, datetime) else start,
            "to": end.isoformat() if isinstance(end, datetime) else end,
            "group_by": group_by,
        }
        headers = {"Accept": "text/csv"} if csv else None
        response = self.transport.request("GET", "/v1/usage", params=params, headers=headers)
        return response.text if csv else UsageReport.model_validate(response.json())

    def ready(self) -> dict[str, Any]:
        """``/readyz``: ``ready`` is whether the database and Ray both answer, as it always was; the server's own
        fields follow (``database``, ``ray``, ``leader``: whether that replica runs the loops). The server answers
        200 while only Ray is down (its API keeps serving), 503 when its database does not answer: an answer here,
        not an error."""
        response = self.transport.request("GET", "/readyz", ok=(503,))
        checks = response.json()
        ray_up = str(checks.get("ray", "")).startswith("ok")
        return {"ready": response.status_code == 200 and ray_up, **checks}

    def plan(self, request: dict[str, Any] | PlanRequest) -> PlanResponse:
        """How a model fits and scales (``POST /v1/plan``): memory per GPU per strategy, the recommendation, the
        global batch, the scaled learning rate and the all-reduce time."""
        if isinstance(request, BaseModel):
            body = request.model_dump(mode="json", exclude_unset=True)
            if body.get("workload") is not None:
                body.pop("params", None)  # the model filled it in from the workload: the server counts again
        else:
            body = dict(request)
        # a plan changes nothing on the server: safe to retry like a GET
        return PlanResponse.model_validate(
            self.transport.request("POST", "/v1/plan", json=body, idempotent=True).json()
        )
