"""Hyperparameter sweeps and their trials: ``client.sweeps``, ``client.trials``, ``Sweep`` and ``Trial``."""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel

from orchestrator_client.metrics_frame import metrics_frame
from orchestrator_client.paging import Pager
from orchestrator_client.resources.bound import Bound
from orchestrator_client.resources.runs import Run, find_by_ref, log_lines
from orchestrator_client.specs import load_spec
from orchestrator_client.transport import Transport, idempotency_headers
from orchestrator_contract.rest import SweepOut, TrialEventOut, TrialMetricOut, TrialOut
from orchestrator_contract.states import JobState, TrialState

Spec = Mapping[str, Any] | BaseModel | str | Path
TRIAL_TERMINAL_STATES = frozenset({TrialState.SUCCEEDED, TrialState.STOPPED, TrialState.FAILED, TrialState.CANCELLED})


class Trial(TrialOut, Bound):
    """One trial of a sweep (every field of ``TrialOut``), with its metrics and history."""

    @property
    def done(self) -> bool:
        return self.state in TRIAL_TERMINAL_STATES

    def reload(self) -> Trial:
        return self._refresh(self._http.request("GET", f"/v1/trials/{self.id}").json())

    def metrics(self, limit: int | None = None, page_size: int | None = None) -> Pager[TrialMetricOut]:
        """One point per epoch it ran (what the search compared), by epoch."""
        return Pager(
            self._http, f"/v1/trials/{self.id}/metrics", TrialMetricOut.model_validate, limit=limit, page_size=page_size
        )

    def metrics_df(self):
        """The metrics as a pandas DataFrame (needs pandas)."""
        return metrics_frame(self.metrics())

    def events(self, limit: int | None = None, page_size: int | None = None) -> Pager[TrialEventOut]:
        return Pager(
            self._http, f"/v1/trials/{self.id}/events", TrialEventOut.model_validate, limit=limit, page_size=page_size
        )


class Sweep(SweepOut, Run):
    """A sweep (every field of ``SweepOut``: ``trials`` is the count per state, ``best_trial`` the best so
    far); ``list_trials()`` iterates the trials themselves (``reload``, ``wait``, ``events``, ``cancel``:
    ``Run``'s)."""

    _collection: ClassVar[str] = "/v1/sweeps"

    def _progress_key(self) -> Hashable:
        return (self.state, self.reason, tuple(sorted(self.trials.items())))

    def list_trials(self, limit: int | None = None, page_size: int | None = None) -> Pager[Trial]:
        """Its trials by number (not ``trials()``: ``trials`` is the API's field of counts per state)."""
        return _trials(self._http, self.id, limit, page_size)

    def logs(self, attempt: int | None = None, tail: int | None = None) -> Iterator[str]:
        """The sweep driver's output (Ray Tune's progress and every trial's workers') as lines."""
        return log_lines(self._http, f"{self._path}/logs", attempt=attempt, tail=tail)


class Sweeps:
    """``client.sweeps``."""

    def __init__(self, transport: Transport) -> None:
        self._http = transport

    def _sweep(self, data: Any) -> Sweep:
        return Sweep.bind(data, self._http)

    def submit(
        self,
        spec: Spec,
        project_id: str | None = None,
        overrides: list[str] | tuple[str, ...] = (),
        idempotency_key: str | Literal[False] | None = None,
    ) -> Sweep:
        """Start a sweep (a dict, a ``SweepSpec`` or a spec file). An ``Idempotency-Key`` goes with it (a fresh
        one unless given; ``False`` sends none), so a retried submit never starts two."""
        body = load_spec(spec, overrides)
        headers = idempotency_headers(idempotency_key)
        response = self._http.request(
            "POST", "/v1/sweeps", json=body, headers=headers, params={"project_id": project_id}
        )
        return self._sweep(response.json())

    def get(self, ref: str) -> Sweep:
        """A sweep by id, or by a prefix of its name that only one sweep's name starts with."""
        return find_by_ref(self._http, "sweep", "/v1/sweeps", ref, self._sweep, lambda s: s.name, lambda s: s.id)

    def list(
        self,
        state: JobState | str | list[JobState | str] | None = None,
        name_prefix: str | None = None,
        limit: int | None = None,
        page_size: int | None = None,
    ) -> Pager[Sweep]:
        states = state if isinstance(state, list | tuple) else [state] if state is not None else []
        params: list[tuple[str, Any]] = [("state", str(s)) for s in states]
        params.append(("name_prefix", name_prefix))
        return Pager(self._http, "/v1/sweeps", self._sweep, params=params, limit=limit, page_size=page_size)


class Trials:
    """``client.trials``."""

    def __init__(self, transport: Transport) -> None:
        self._http = transport

    def get(self, trial_id: str) -> Trial:
        return Trial.bind(self._http.request("GET", f"/v1/trials/{trial_id}").json(), self._http)

    def list(self, sweep_id: str, limit: int | None = None, page_size: int | None = None) -> Pager[Trial]:
        """A sweep's trials by number (the same as ``sweep.list_trials()``)."""
        return _trials(self._http, sweep_id, limit, page_size)


def _trials(transport: Transport, sweep_id: str, limit: int | None, page_size: int | None) -> Pager[Trial]:
    return Pager(
        transport,
        f"/v1/sweeps/{sweep_id}/trials",
        lambda data: Trial.bind(data, transport),
        limit=limit,
        page_size=page_size,
    )
