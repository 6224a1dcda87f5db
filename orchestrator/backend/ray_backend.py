"""ClusterBackend on a real Ray cluster, through the Ray Jobs and State APIs (HTTP, token auth)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from threading import Lock
from typing import Generic, TypeVar

import httpx
from ray.job_submission import JobSubmissionClient

from orchestrator.admission import ClusterCapacity
from orchestrator.backend import (
    BackendUnavailable,
    ClusterNode,
    LogChunk,
    PackageOpener,
    RayJob,
    RunInfo,
    RunNotFound,
    RunStatus,
    ServeApp,
    ServeConfigRejected,
    ServeReplica,
    ServeStatus,
    SubmissionTaken,
)
from orchestrator.backend.dashboard import (
    JobNotFound,
    alive_nodes,
    auth_headers,
    delete_job,
    job_details,
    job_logs,
    list_jobs,
    package_exists,
    put_package,
    put_serve_applications,
    serve_applications,
    state_list,
    stop_job,
    train_worker_nodes,
)
from orchestrator.backend.ray_jobs import live_ray_jobs

log = logging.getLogger(__name__)

_CAPACITY_TTL_S = 5.0
# Ray's JobDetails.error_type when the supervisor (and so the driver) could not be placed: the driver never ran.
SUPERVISOR_UNSCHEDULABLE = "JOB_SUPERVISOR_ACTOR_UNSCHEDULABLE"
T = TypeVar("T")

# Ray's log tail (a websocket, relayed by the head from the driver node's agent) sends a log file in batches of
# up to 10 lines or past 20,000 characters, read as fast as they come until the end of the file
# (ray/dashboard/modules/job/utils.py: file_tail_iterator); a batch short of both was cut by the file's end.
_TAIL_BATCH_LINES, _TAIL_BATCH_CHARS = 10, 20_000
# At the end of the file the agent waits a second, then sends what it read since (so a batch cut by the end comes
# a second after the one before it): a tail this long without a message after a full batch is at the end too.
# Before the first message nothing is said (the head waits a second for the driver's agent; a driver that has
# printed nothing has nothing to catch up on).
_TAIL_QUIET_S = 2.0


def _said(exc: Exception) -> str:
    """An HTTP error as a log line: the status and the start of what the dashboard answered."""
    if isinstance(exc, httpx.HTTPStatusError):
        return f"HTTP {exc.response.status_code}: {exc.response.text[:500]}"
    return f"{type(exc).__name__}: {exc}"


class _Cached(Generic[T]):
    """Ray's last answer to one question, reused for ``ttl_s`` (an error is never kept)."""

    def __init__(self, ttl_s: float):
        self.ttl_s = ttl_s
        self._answer: tuple[float, T] | None = None

    def get(self, ask: Callable[[], T], fresh: bool = False) -> T:
        answer = self._answer
        if answer is not None and not fresh and time.monotonic() - answer[0] < self.ttl_s:
            return answer[1]
        value = ask()
        self._answer = (time.monotonic(), value)
        return value


class RayBackend:
    def __init__(self, dashboard_url: str, token: str | None = None):
        self.dashboard_url = dashboard_url
        self.headers = auth_headers(token)
        self._client: JobSubmissionClient | None = None
        # Asked every tick by the scheduler, the status route and the dashboard: Ray's answer is reused a while.
        self._capacity: _Cached[ClusterCapacity] = _Cached(_CAPACITY_TTL_S)
        self._nodes: _Cached[list[ClusterNode]] = _Cached(_CAPACITY_TTL_S)
        self._jobs: _Cached[list[RayJob]] = _Cached(_CAPACITY_TTL_S)
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

    def capacity(self, fresh: bool = False) -> ClusterCapacity:
        return self._capacity.get(self._read_capacity, fresh)

    def _read_capacity(self) -> ClusterCapacity:
        try:
            nodes = alive_nodes(self.dashboard_url, self.headers)
        except (httpx.HTTPError, KeyError, ValueError) as exc:
            raise BackendUnavailable(f"listing Ray nodes at {self.dashboard_url}: {exc}") from exc
        if not nodes:  # a head still starting (or restarting): nothing can run yet, and nothing "never fits"
            raise BackendUnavailable(f"the Ray cluster at {self.dashboard_url} has no alive node yet")
        total = {"CPU": 0.0, "GPU": 0.0}
        largest = {"CPU": 0.0, "GPU": 0.0}
        for node in nodes:
            for resource in total:
                amount = float((node.get("resources_total") or {}).get(resource, 0.0))
                total[resource] += amount
                largest[resource] = max(largest[resource], amount)
        return ClusterCapacity(total=total, largest_node=largest)

    def nodes(self) -> list[ClusterNode]:
        return self._nodes.get(self._read_nodes)

    def _read_nodes(self) -> list[ClusterNode]:
        try:
            found = alive_nodes(self.dashboard_url, self.headers)
        except (httpx.HTTPError, KeyError, ValueError) as exc:
            raise BackendUnavailable(f"listing Ray nodes at {self.dashboard_url}: {exc}") from exc
        return [
            ClusterNode(
                node_id=str(node.get("node_id", "")),
                address=str(node.get("node_ip", "")),
                is_head=bool(node.get("is_head_node")),
                total={k: float(v) for k, v in (node.get("resources_total") or {}).items() if k in ("CPU", "GPU")},
            )
            for node in found
        ]

    def live_jobs(self) -> list[RayJob]:
        return self._jobs.get(self._read_live_jobs)

    def _read_live_jobs(self) -> list[RayJob]:
        try:
            jobs = list_jobs(self.dashboard_url, self.headers)
            # Nothing is live (the common case between runs): no need to ask what anything holds.
            if any(j.get("status") in ("PENDING", "RUNNING") for j in jobs):
                actors = state_list(self.dashboard_url, self.headers, "actors", {"state": "ALIVE"}, detail=True)
                groups = state_list(
                    self.dashboard_url, self.headers, "placement_groups", {"state": "CREATED"}, detail=True
                )
                tasks = state_list(self.dashboard_url, self.headers, "tasks", {"state": "RUNNING"}, detail=True)
            else:
                actors = groups = tasks = []
            return live_ray_jobs(jobs, actors, groups, tasks)
        except (httpx.HTTPError, KeyError, ValueError, TypeError) as exc:
            raise BackendUnavailable(f"listing Ray jobs at {self.dashboard_url}: {_said(exc)}") from exc

    def worker_nodes(self, submission_id: str) -> set[str]:
        try:
            ray_job_id = job_details(self.dashboard_url, self.headers, submission_id).get("job_id")
            return train_worker_nodes(self.dashboard_url, self.headers, ray_job_id) if ray_job_id else set()
        except JobNotFound:
            return set()
        except (httpx.HTTPError, KeyError, ValueError) as exc:
            raise BackendUnavailable(f"listing the workers of {submission_id}: {_said(exc)}") from exc

    def submit(self, submission_id: str, entrypoint: str, runtime_env: dict, metadata: dict[str, str]) -> None:
        try:
            self.client.submit_job(
                entrypoint=entrypoint,
                submission_id=submission_id,
                runtime_env=runtime_env,
                metadata=metadata,
            )
        except BackendUnavailable:
            raise
        except Exception as exc:
            if "already exists" in str(exc):
                self._check_ours(submission_id, runtime_env)
                log.info("submission %s already exists; not starting a second copy", submission_id)
                return
            raise BackendUnavailable(f"submitting {submission_id}: {exc}") from exc

    def _check_ours(self, submission_id: str, runtime_env: dict) -> None:
        """Ray has a job under ``submission_id``: ours (an earlier send of this very submission, whose answer was
        lost) only if its environment variables are the ones sent now, the driver's claim code among them; else
        someone with the cluster's token took the id first (SubmissionTaken), and it is never followed as ours."""
        try:
            existing = job_details(self.dashboard_url, self.headers, submission_id)
        except JobNotFound:
            raise BackendUnavailable(f"submitting {submission_id}: Ray said it exists, then had no record") from None
        except (httpx.HTTPError, ValueError) as exc:
            raise BackendUnavailable(f"reading back {submission_id}: {_said(exc)}") from exc
        if ((existing.get("runtime_env") or {}).get("env_vars") or {}) != runtime_env.get("env_vars", {}):
            entrypoint = str(existing.get("entrypoint") or "")[:200]
            raise SubmissionTaken(
                f"Ray already has a job {submission_id} that the control plane did not submit (entrypoint: "
                f"{entrypoint!r}): someone holding the cluster's Ray token took this attempt's submission id"
            )

    # info, stop and logs go through the dashboard's HTTP routes ourselves rather than JobSubmissionClient,
    # whose errors are a RuntimeError with the status inside their text: here the status decides what an
    # answer means, and only Ray's own 404 about the job reads as "Ray has no such run" (docs/security.md, finding 10).

    def info(self, submission_id: str) -> RunInfo:
        try:
            details = job_details(self.dashboard_url, self.headers, submission_id)
        except JobNotFound:
            return RunInfo(RunStatus.MISSING, "Ray has no record of this submission")
        except (httpx.HTTPError, ValueError) as exc:
            raise BackendUnavailable(f"reading {submission_id}: {_said(exc)}") from exc
        try:
            status = RunStatus(details["status"])
        except ValueError as exc:
            raise BackendUnavailable(f"reading {submission_id}: unknown status {details['status']!r}") from exc
        exit_code = details.get("driver_exit_code")
        return RunInfo(
            status,
            details.get("message") or "",
            exit_code if isinstance(exit_code, int) else None,
            unschedulable=details.get("error_type") == SUPERVISOR_UNSCHEDULABLE,
        )

    def stop(self, submission_id: str) -> None:
        try:
            stop_job(self.dashboard_url, self.headers, submission_id)
        except JobNotFound:
            return  # gone already: nothing to stop
        except httpx.HTTPError as exc:
            raise BackendUnavailable(f"stopping {submission_id}: {_said(exc)}") from exc

    def forget(self, submission_id: str) -> None:
        try:
            delete_job(self.dashboard_url, self.headers, submission_id)
        except JobNotFound:
            return
        except httpx.HTTPError as exc:
            raise BackendUnavailable(f"deleting Ray's record of {submission_id}: {_said(exc)}") from exc

    def logs(self, submission_id: str) -> str | None:
        try:
            return job_logs(self.dashboard_url, self.headers, submission_id)
        except JobNotFound:
            return None
        except (httpx.HTTPError, ValueError) as exc:
            raise BackendUnavailable(f"reading logs of {submission_id}: {_said(exc)}") from exc

    async def tail_logs(self, submission_id: str) -> AsyncIterator[LogChunk]:
        # Ray's own client (JobSubmissionClient.tail_job_logs: the dashboard's /api/jobs/{id}/logs/tail
        # websocket), read by a task of its own into a queue, so that a quiet spell can be told apart.
        client = await asyncio.to_thread(lambda: self.client)
        messages: asyncio.Queue[str | BaseException | None] = asyncio.Queue(maxsize=100)

        async def receive() -> None:
            try:
                async for text in client.tail_job_logs(submission_id):
                    await messages.put(text)
            except Exception as exc:
                await messages.put(exc)
            else:
                await messages.put(None)

        receiver = asyncio.create_task(receive())
        try:
            at_end = True  # nothing to say until a first full batch
            while True:
                try:
                    item = await asyncio.wait_for(messages.get(), None if at_end else _TAIL_QUIET_S)
                except TimeoutError:
                    at_end = True
                    yield LogChunk("", at_end=True)
                    continue
                if item is None:
                    return  # Ray ended the tail: the run ended and all of it was sent (or the relay broke)
                if isinstance(item, BaseException):
                    # A handshake Ray refused carries its HTTP status: 404 is "no such job" (job_head.py).
                    if getattr(item, "status", None) == 404:
                        raise RunNotFound(submission_id) from item
                    raise BackendUnavailable(f"following the log of {submission_id}: {item!r}") from item
                at_end = item.count("\n") < _TAIL_BATCH_LINES and len(item) <= _TAIL_BATCH_CHARS
                yield LogChunk(item, at_end)
        finally:
            receiver.cancel()

    def upload_package(self, uri: str, open_package: PackageOpener, size: int) -> bool:
        # What JobSubmissionClient does for a working_dir (GET, then PUT if missing), over the dashboard's
        # HTTP API with our headers, streaming the zip instead of reading it whole.
        try:
            if package_exists(self.dashboard_url, self.headers, uri):
                return False
            with open_package() as source:
                put_package(self.dashboard_url, self.headers, uri, iter(lambda: source.read(1024 * 1024), b""), size)
        except (httpx.HTTPError, OSError) as exc:
            raise BackendUnavailable(f"uploading code package {uri} to Ray at {self.dashboard_url}: {exc}") from exc
        log.info("uploaded %s (%d bytes) to Ray's package store", uri, size)
        return True

    # --- Ray Serve through the dashboard's REST API (the control plane never joins the cluster) ---

    def serve_status(self) -> ServeStatus:
        try:
            details = serve_applications(self.dashboard_url, self.headers)
        except (httpx.HTTPError, ValueError) as exc:
            raise BackendUnavailable(f"reading Serve's applications at {self.dashboard_url}: {exc}") from exc
        return parse_serve_details(details)

    def apply_serve(self, config: dict) -> None:
        try:
            response = put_serve_applications(self.dashboard_url, self.headers, config)
        except httpx.HTTPError as exc:
            raise BackendUnavailable(f"applying the Serve config at {self.dashboard_url}: {exc}") from exc
        if response.status_code == 400:
            raise ServeConfigRejected(response.text[-4000:])
        if response.status_code >= 300:
            raise BackendUnavailable(f"applying the Serve config: HTTP {response.status_code}: {response.text[-2000:]}")


def parse_serve_details(details: dict) -> ServeStatus:
    """``GET /api/serve/applications/`` (Serve's ServeInstanceDetails) as plain types."""
    apps = {}
    for name, app in (details.get("applications") or {}).items():
        deployments = list((app.get("deployments") or {}).values())
        first = deployments[0] if deployments else {}
        apps[name] = ServeApp(
            name=name,
            status=str(app.get("status", "")),
            message=str(app.get("message") or ""),
            config=app.get("deployed_app_config"),
            deployment_status=str(first.get("status", "")),
            deployment_message=str(first.get("message") or ""),
            replicas=tuple(
                ServeReplica(str(r.get("replica_id", "")), str(r.get("state", "")))
                for d in deployments
                for r in d.get("replicas") or []
            ),
            target_replicas=int(first.get("target_num_replicas") or 0),
        )
    http = details.get("http_options") or {}
    running = bool(details.get("controller_info")) or bool(apps)
    return ServeStatus(running=running, apps=apps, http_port=http.get("port"))
