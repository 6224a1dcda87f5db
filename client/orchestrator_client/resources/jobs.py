"""Training jobs: ``client.jobs`` (submit, get, list) and the ``Job`` it hands back."""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel

from orchestrator_client.metrics_frame import metrics_frame
from orchestrator_client.paging import Pager
from orchestrator_client.resources.runs import Run, find_by_ref, log_lines
from orchestrator_client.specs import load_spec
from orchestrator_client.transport import Transport, idempotency_headers
from orchestrator_contract import workloads
from orchestrator_contract.rest import CheckpointOut, JobOut, MetricOut
from orchestrator_contract.states import JobState

Spec = Mapping[str, Any] | BaseModel | str | Path


class Job(JobOut, Run):
    """A training job (every field of the API's ``JobOut``) that can reload, wait, stream its logs, read its
    metrics and checkpoints, and cancel itself (``reload``, ``wait``, ``events``, ``cancel``: ``Run``'s)."""

    _collection: ClassVar[str] = "/v1/jobs"

    def _progress_text(self) -> str:
        return f"{self.state.value} ({self.reason})" if self.reason else self.state.value

    def _progress_key(self) -> Hashable:
        return (self.state, self.attempt, self.reason)

    def logs(
        self, follow: bool = False, attempt: int | None = None, tail: int | None = None, rank: int | None = None
    ) -> Iterator[str]:
        """Its output as lines (no newlines). ``follow``: streamed as it runs, until the job ends (the current
        attempt; ``tail`` lines to start with). ``attempt``: an earlier attempt's. ``rank``: one rank's lines."""
        return log_lines(self._http, f"{self._path}/logs", follow=follow, attempt=attempt, tail=tail, rank=rank)

    def metrics(self, limit: int | None = None, page_size: int | None = None) -> Pager[MetricOut]:
        """Rank 0's metric reports, by attempt then step."""
        return Pager(self._http, f"{self._path}/metrics", MetricOut.model_validate, limit=limit, page_size=page_size)

    def metrics_df(self):  # -> pandas.DataFrame (pandas is optional: not named in the signature)
        """The metrics as a pandas DataFrame: one row per report, columns attempt, epoch, step, created_at and
        one per metric. Needs pandas (``pip install 'orchestrator-client[pandas]'``)."""
        return metrics_frame(self.metrics())

    def checkpoints(self) -> list[CheckpointOut]:
        """Its committed checkpoints (the ones retention keeps), by step."""
        return list(Pager(self._http, f"{self._path}/checkpoints", CheckpointOut.model_validate))

    def best_checkpoint(
        self, metric: str | None = None, mode: Literal["max", "min"] | None = None
    ) -> CheckpointOut | None:
        """The checkpoint with the best ``metric`` (ties: the later), None when none carries it. ``metric``
        defaults the way the server's ``select: best`` does: the job's ``checkpoint.keep_best`` metric, else
        its workload's selection metric (val_accuracy); ``mode`` as the server defaults it: the loop's metrics'
        (max for val_accuracy and samples_per_s, min for the losses), else the workload's declared one."""
        metric, mode = self._selection(metric, mode)
        best: CheckpointOut | None = None
        for checkpoint in self.checkpoints():  # by step: a later one wins a tie
            value = checkpoint.metrics.get(metric)
            if not isinstance(value, int | float) or isinstance(value, bool):
                continue
            current = None if best is None else best.metrics[metric]
            if current is None or (value >= current if mode == "max" else value <= current):
                best = checkpoint
        return best

    def _selection(self, metric: str | None, mode: str | None) -> tuple[str, str]:
        keep_best = (self.spec.get("checkpoint") or {}).get("keep_best") or {}
        entrypoint = bool(self.spec.get("entrypoint"))
        if metric is None:
            if keep_best.get("metric"):
                metric = keep_best["metric"]
            elif entrypoint:
                raise ValueError(
                    f"job {self.id} ran a training function: its checkpoints carry its own metrics; name one (metric=...)"
                )
            else:
                metric = workloads.selection_of(self.workload)[0]
        if mode is None:
            if metric == keep_best.get("metric") and keep_best.get("mode"):
                mode = keep_best["mode"]
            else:
                mode = workloads.metric_mode(None if entrypoint else self.workload, metric)  # ValueError: say it
        if mode not in ("max", "min"):
            raise ValueError(f"mode is 'max' or 'min', not {mode!r}")
        return metric, mode


class Jobs:
    """``client.jobs``."""

    def __init__(self, transport: Transport) -> None:
        self._http = transport

    def _job(self, data: Any) -> Job:
        return Job.bind(data, self._http)

    def submit(
        self,
        spec: Spec,
        idempotency_key: str | Literal[False] | None = None,
        project_id: str | None = None,
        overrides: list[str] | tuple[str, ...] = (),
    ) -> Job:
        """Submit a job: ``spec`` is a dict, a ``JobSpec``, or a .yaml/.yml/.json file (``overrides``:
        ``"key.path=value"`` applied to it). An ``Idempotency-Key`` goes with it (a fresh one unless given;
        ``False`` sends none), so a retried submit never makes two jobs."""
        body = load_spec(spec, overrides)
        headers = idempotency_headers(idempotency_key)
        response = self._http.request("POST", "/v1/jobs", json=body, headers=headers, params={"project_id": project_id})
        return self._job(response.json())

    def get(self, ref: str) -> Job:
        """A job by id, or by a prefix of its name that only one job's name starts with (else ``Conflict``)."""
        return find_by_ref(self._http, "job", "/v1/jobs", ref, self._job, lambda j: j.name, lambda j: j.id)

    def list(
        self,
        state: JobState | str | list[JobState | str] | None = None,
        labels: Mapping[str, str] | None = None,
        name_prefix: str | None = None,
        limit: int | None = None,
        page_size: int | None = None,
    ) -> Pager[Job]:
        """Jobs newest first, page by page as you iterate; ``state``: one or several; ``labels``: all must match."""
        params: list[tuple[str, Any]] = [("state", str(s)) for s in _as_list(state)]
        params += [("label", f"{key}={value}") for key, value in (labels or {}).items()]
        params.append(("name_prefix", name_prefix))
        return Pager(self._http, "/v1/jobs", self._job, params=params, limit=limit, page_size=page_size)

    def cancel(self, ref: str) -> Job:
        return self.get(ref).cancel()


def _as_list(value: Any) -> list:
    if value is None:
        return []
    return list(value) if isinstance(value, list | tuple | set | frozenset) else [value]
