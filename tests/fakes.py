"""An in-memory ClusterBackend for unit tests: records what the control plane asks of Ray."""

from __future__ import annotations

from dataclasses import dataclass, field

from orchestrator.admission import ClusterCapacity
from orchestrator.backend import BackendUnavailable, RunInfo, RunStatus


@dataclass
class FakeBackend:
    total: dict[str, float] = field(default_factory=lambda: {"CPU": 4.0, "GPU": 0.0})
    runs: dict[str, RunStatus] = field(default_factory=dict)
    submitted: list[tuple[str, str, dict]] = field(default_factory=list)
    stopped: list[str] = field(default_factory=list)
    available: bool = True

    def capacity(self) -> ClusterCapacity:
        self._check()
        return ClusterCapacity(total=dict(self.total), largest_node=dict(self.total))

    def submit(self, submission_id, entrypoint, env_vars, metadata) -> None:
        self._check()
        self.submitted.append((submission_id, entrypoint, dict(env_vars)))
        self.runs.setdefault(submission_id, RunStatus.PENDING)

    def info(self, submission_id) -> RunInfo:
        self._check()
        return RunInfo(self.runs.get(submission_id, RunStatus.MISSING), "fake")

    def stop(self, submission_id) -> None:
        self._check()
        self.stopped.append(submission_id)
        if submission_id in self.runs and not self.runs[submission_id].finished:
            self.runs[submission_id] = RunStatus.STOPPED

    def logs(self, submission_id) -> str | None:
        return f"log of {submission_id}\n" if submission_id in self.runs else None

    def _check(self) -> None:
        if not self.available:
            raise BackendUnavailable("fake cluster is down")
