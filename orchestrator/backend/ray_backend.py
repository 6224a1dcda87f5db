"""ClusterBackend on a real Ray cluster, through the Ray Jobs and State APIs (HTTP, token auth)."""

from __future__ import annotations

import logging
import time
from threading import Lock

import httpx
from ray.job_submission import JobStatus, JobSubmissionClient

from orchestrator.admission import ClusterCapacity
from orchestrator.backend import BackendUnavailable, RunInfo, RunStatus
from orchestrator.backend.dashboard import alive_nodes, auth_headers

log = logging.getLogger(__name__)

_CAPACITY_TTL_S = 5.0


def _is_not_found(exc: Exception) -> bool:
    return "does not exist" in str(exc) or "404" in str(exc)


class RayBackend:
    def __init__(self, dashboard_url: str, token: str | None = None):
        self.dashboard_url = dashboard_url
        self.headers = auth_headers(token)
        self._client: JobSubmissionClient | None = None
        self._capacity: tuple[float, ClusterCapacity] | None = None
        self._lock = Lock()

    @property
    def client(self) -> JobSubmissionClient:
        # Created lazily: the constructor makes an HTTP call, and the cluster may still be starting.
        with self._lock:
            if self._client is None:
                try:
                    self._client = JobSubmissionClient(self.dashboard_url, headers=self.headers)
                except Exception as exc:  # ray raises ConnectionError, RuntimeError, ...
                    raise BackendUnavailable(f"Ray dashboard at {self.dashboard_url}: {exc}") from exc
            return self._client

    def capacity(self) -> ClusterCapacity:
        cached = self._capacity
        if cached and time.monotonic() - cached[0] < _CAPACITY_TTL_S:
            return cached[1]
        try:
            nodes = alive_nodes(self.dashboard_url, self.headers)
        except (httpx.HTTPError, KeyError, ValueError) as exc:
            raise BackendUnavailable(f"listing Ray nodes at {self.dashboard_url}: {exc}") from exc
        total = {"CPU": 0.0, "GPU": 0.0}
        largest = {"CPU": 0.0, "GPU": 0.0}
        for node in nodes:
            for resource in total:
                amount = float((node.get("resources_total") or {}).get(resource, 0.0))
                total[resource] += amount
                largest[resource] = max(largest[resource], amount)
        capacity = ClusterCapacity(total=total, largest_node=largest)
        self._capacity = (time.monotonic(), capacity)
        return capacity

    def submit(self, submission_id: str, entrypoint: str, env_vars: dict[str, str], metadata: dict[str, str]) -> None:
        try:
            self.client.submit_job(
                entrypoint=entrypoint,
                submission_id=submission_id,
                runtime_env={"env_vars": env_vars},
                metadata=metadata,
            )
        except BackendUnavailable:
            raise
        except Exception as exc:
            if "already exists" in str(exc):
                log.info("submission %s already exists; not starting a second copy", submission_id)
                return
            raise BackendUnavailable(f"submitting {submission_id}: {exc}") from exc

    def info(self, submission_id: str) -> RunInfo:
        try:
            details = self.client.get_job_info(submission_id)
        except BackendUnavailable:
            raise
        except Exception as exc:
            if _is_not_found(exc):
                return RunInfo(RunStatus.MISSING, "Ray has no record of this submission")
            raise BackendUnavailable(f"reading {submission_id}: {exc}") from exc
        status = RunStatus(details.status.value if isinstance(details.status, JobStatus) else str(details.status))
        return RunInfo(status, details.message or "")

    def stop(self, submission_id: str) -> None:
        try:
            self.client.stop_job(submission_id)
        except BackendUnavailable:
            raise
        except Exception as exc:
            if not _is_not_found(exc):
                raise BackendUnavailable(f"stopping {submission_id}: {exc}") from exc

    def logs(self, submission_id: str) -> str | None:
        try:
            return self.client.get_job_logs(submission_id)
        except BackendUnavailable:
            raise
        except Exception as exc:
            if _is_not_found(exc):
                return None
            raise BackendUnavailable(f"reading logs of {submission_id}: {exc}") from exc
