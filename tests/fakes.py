"""An in-memory ClusterBackend for unit tests: records what the control plane asks of Ray."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from orchestrator.admission import ClusterCapacity
from orchestrator.backend import (
    BackendUnavailable,
    ClusterNode,
    LogChunk,
    RayJob,
    RunInfo,
    RunNotFound,
    RunStatus,
    ServeApp,
    ServeReplica,
    ServeStatus,
    SubmissionTaken,
)


@dataclass
class FakeBackend:
    total: dict[str, float] = field(default_factory=lambda: {"CPU": 4.0, "GPU": 0.0})
    # What a cached look at the cluster says (None: the same as ``total``); ``capacity(fresh=True)`` sees ``total``.
    cached_total: dict[str, float] | None = None
    runs: dict[str, RunStatus] = field(default_factory=dict)
    # (submission id, entrypoint, the runtime_env's env_vars) of every submission
    submitted: list[tuple[str, str, dict]] = field(default_factory=list)
    runtime_envs: list[dict] = field(default_factory=list)  # each submission's whole runtime_env
    metadata: list[dict] = field(default_factory=list)  # each submission's metadata (Ray lists it with the job)
    # What the submissions' drivers claimed: claim code -> the run's token (tests.unit.api_helpers.run_token)
    driver_tokens: dict[str, str] = field(default_factory=dict)
    stopped: list[str] = field(default_factory=list)
    exit_codes: dict[str, int] = field(default_factory=dict)
    # Each submission's environment variables as Ray keeps them (a second submit under the id must match them).
    env_vars: dict[str, dict] = field(default_factory=dict)
    # Submissions Ray could not place (RunInfo.unschedulable), and those whose record the control plane deleted.
    unschedulable: set[str] = field(default_factory=set)
    forgotten: list[str] = field(default_factory=list)
    available: bool = True
    # Ray Serve: every config the control plane applied, and the applications as Serve would report them.
    # An applied application starts DEPLOYING; a test moves it on with serve_settle().
    serve_applied: list[dict] = field(default_factory=list)
    serve_apps: dict[str, ServeApp] = field(default_factory=dict)
    # Every backend method the control plane called, in order, recorded before the call can raise
    # (``available=False``): what a test checks to know whether Ray was asked at all.
    asked: list[str] = field(default_factory=list)
    # Ray's package store: uri -> the zip's bytes, as uploaded (a working_dir's code)
    packages: dict[str, bytes] = field(default_factory=dict)
    # The drivers' output as Ray's log files hold it, by submission id (default: one line naming it): a test
    # sets or appends to it. ``logs`` and ``tail_logs`` count every character they hand the control plane.
    log_texts: dict[str, str] = field(default_factory=dict)
    log_chars_read: int = 0
    tail_poll_s: float = 0.01  # how often a tail looks at the file for more (Ray's agent: 1 s)
    node_ids: list[str] = field(default_factory=lambda: ["fake-head"])  # the alive nodes, the head first
    # The nodes Ray lists a submission's Train workers on, by submission id (default: every alive node).
    worker_node_ids: dict[str, set[str]] = field(default_factory=dict)
    # The live Ray jobs ``live_jobs`` lists (a test sets them: the runs submitted here are not listed).
    ray_jobs: list[RayJob] = field(default_factory=list)

    def capacity(self, fresh: bool = False) -> ClusterCapacity:
        self._check("capacity")
        total = self.total if fresh or self.cached_total is None else self.cached_total
        return ClusterCapacity(total=dict(total), largest_node=dict(total))

    def nodes(self) -> list[ClusterNode]:
        self._check("nodes")
        return [
            ClusterNode(node_id=node_id, address="127.0.0.1", is_head=i == 0, total=dict(self.total))
            for i, node_id in enumerate(self.node_ids)
        ]

    def live_jobs(self) -> list[RayJob]:
        self._check("live_jobs")
        return list(self.ray_jobs)

    def worker_nodes(self, submission_id: str) -> set[str]:
        self._check("worker_nodes")
        return set(self.worker_node_ids.get(submission_id, self.node_ids))

    def submit(self, submission_id, entrypoint, runtime_env, metadata) -> None:
        self._check("submit")
        known = self.env_vars.get(submission_id) if submission_id in self.runs else None
        if known is not None and known != runtime_env["env_vars"]:
            raise SubmissionTaken(f"Ray already has a job {submission_id} that the control plane did not submit")
        if submission_id not in self.runs:
            self.env_vars[submission_id] = dict(runtime_env["env_vars"])
        self.runtime_envs.append(copy.deepcopy(runtime_env))
        self.metadata.append(dict(metadata))
        self.submitted.append((submission_id, entrypoint, dict(runtime_env["env_vars"])))
        self.runs.setdefault(submission_id, RunStatus.PENDING)

    def squat(self, submission_id: str) -> None:
        """Someone with the cluster's token submits a job of their own under ``submission_id`` first."""
        self.runs[submission_id] = RunStatus.RUNNING
        self.env_vars[submission_id] = {"SOMEONE": "else"}

    def info(self, submission_id) -> RunInfo:
        self._check("info")
        return RunInfo(
            self.runs.get(submission_id, RunStatus.MISSING),
            "fake",
            self.exit_codes.get(submission_id),
            unschedulable=submission_id in self.unschedulable,
        )

    def forget(self, submission_id) -> None:
        self._check("forget")
        assert self.runs.get(submission_id, RunStatus.MISSING).finished, "Ray deletes only an ended job"
        self.forgotten.append(submission_id)
        self.runs.pop(submission_id, None)
        self.env_vars.pop(submission_id, None)
        self.unschedulable.discard(submission_id)

    def stop(self, submission_id) -> None:
        self._check("stop")
        self.stopped.append(submission_id)
        if submission_id in self.runs and not self.runs[submission_id].finished:
            self.runs[submission_id] = RunStatus.STOPPED

    def printed(self, submission_id) -> str | None:
        """What the submission's driver has printed so far; None when Ray has no such log."""
        if submission_id in self.log_texts:
            return self.log_texts[submission_id]
        return f"log of {submission_id}\n" if submission_id in self.runs else None

    def logs(self, submission_id) -> str | None:
        self.asked.append("logs")
        text = self.printed(submission_id)
        self.log_chars_read += len(text or "")
        return text

    async def tail_logs(self, submission_id) -> AsyncIterator[LogChunk]:
        """Ray's log tail: the file from its start, then what is appended, each character once; ends after the
        run ended and the rest was sent. Every chunk reaches the end of the file as it was read (``at_end``)."""
        self._check("tail_logs")
        if submission_id not in self.runs:
            raise RunNotFound(submission_id)
        sent = None
        while True:
            if not self.available:
                raise BackendUnavailable("fake cluster is down")
            ended = self.runs.get(submission_id, RunStatus.MISSING).finished  # first: nothing is printed after it
            text = self._file(submission_id)
            if sent is None or len(text) > sent:
                chunk = text[sent or 0 :]
                self.log_chars_read += len(chunk)
                yield LogChunk(chunk, at_end=True)
                sent = len(text)
            if ended:
                return
            await asyncio.sleep(self.tail_poll_s)

    def _file(self, submission_id) -> str:
        # Tests written before tails existed replace ``logs`` to say what Ray holds: the tail reads that too.
        replaced = vars(self).get("logs")
        return (replaced(submission_id) if replaced else self.printed(submission_id)) or ""

    def upload_package(self, uri, open_package, size) -> bool:
        self._check("upload_package")
        if uri in self.packages:
            return False
        with open_package() as source:
            data = source.read()
        assert len(data) == size, (uri, len(data), size)
        self.packages[uri] = data
        return True

    def serve_status(self) -> ServeStatus:
        self._check("serve_status")
        return ServeStatus(running=bool(self.serve_applied), apps=dict(self.serve_apps), http_port=None)

    def apply_serve(self, config: dict) -> None:
        self._check("apply_serve")
        self.serve_applied.append(config)
        wanted = {app["name"]: app for app in config["applications"]}
        for name in list(self.serve_apps):
            if name not in wanted:
                del self.serve_apps[name]
        for name, app in wanted.items():
            current = self.serve_apps.get(name)
            if current is None or current.config != app:
                self.serve_apps[name] = ServeApp(name=name, status="DEPLOYING", config=app)

    def serve_settle(self, name: str, status: str = "RUNNING", message: str = "", replicas: int = 1) -> None:
        """What Serve would report once a rollout ends (RUNNING) or fails (DEPLOY_FAILED, UNHEALTHY)."""
        app = self.serve_apps[name]
        running = tuple(ServeReplica(f"{name}-r{i}", "RUNNING") for i in range(replicas)) if status == "RUNNING" else ()
        self.serve_apps[name] = ServeApp(
            name=name,
            status=status,
            message=message,
            config=app.config,
            deployment_status="",
            deployment_message="",
            replicas=running,
            target_replicas=replicas,
        )

    def _check(self, method: str) -> None:
        self.asked.append(method)
        if not self.available:
            raise BackendUnavailable("fake cluster is down")
