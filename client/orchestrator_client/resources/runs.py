"""What jobs and sweeps share: both are runs (one Ray job per attempt) with the same lifecycle, logs and
state history, and both are found by an id or a unique name prefix."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator
from typing import Any, ClassVar, Self, TypeVar
from urllib.parse import quote

from orchestrator_client.errors import Conflict, NotFound
from orchestrator_client.paging import Pager
from orchestrator_client.resources.bound import Bound
from orchestrator_client.transport import Transport
from orchestrator_client.waiting import poll_until
from orchestrator_contract.rest import JobEventOut
from orchestrator_contract.states import JobState

TERMINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
MAX_CANDIDATES = 10  # names an ambiguous prefix's Conflict lists

R = TypeVar("R")


class Run(Bound):
    """What a ``Job`` and a ``Sweep`` do alike: reload, wait, read their state history, cancel. A base for
    ``class Job(JobOut, Run)``: it declares no fields (``id``, ``state``, ``reason`` come from the contract's
    ``RunOut`` beside it), so ``model_dump()`` stays exactly the API's JSON."""

    _collection: ClassVar[str]  # "/v1/jobs": where this kind of run lives

    @property
    def done(self) -> bool:
        """In a terminal state (SUCCEEDED, FAILED, CANCELLED)."""
        return self.state in TERMINAL_STATES

    @property
    def succeeded(self) -> bool:
        return self.state == JobState.SUCCEEDED

    @property
    def _path(self) -> str:
        return f"{self._collection}/{self.id}"

    def reload(self) -> Self:
        """This run as the server has it now (updated in place; returns itself)."""
        return self._refresh(self._http.request("GET", self._path).json())

    def wait(
        self, timeout: float | None = None, poll: float = 2.0, on_change: Callable[[Self], None] | None = None
    ) -> Self:
        """Until the run ends; returns it (whatever the end: check ``succeeded``). ``on_change(run)``: called
        at the start and whenever its progress changes (a job's state, attempt or reason; a sweep's state,
        reason or trial counts). Past ``timeout`` s: ``WaitTimeout``."""
        return poll_until(
            self,
            self.reload,
            lambda run: run.done,
            timeout=timeout,
            poll=poll,
            what=lambda run: run._progress_text(),
            on_change=on_change,
            change_key=lambda run: run._progress_key(),
        )

    def _progress_text(self) -> str:
        """How ``WaitTimeout`` names where the run was."""
        return self.state.value

    def _progress_key(self) -> Hashable:
        """What counts as a change for ``wait(on_change=...)``."""
        return (self.state, self.reason)

    def events(self, limit: int | None = None, page_size: int | None = None) -> Pager[JobEventOut]:
        """Its state history, oldest first."""
        return Pager(self._http, f"{self._path}/events", JobEventOut.model_validate, limit=limit, page_size=page_size)

    def cancel(self) -> Self:
        """Cancel it; returns it updated (a queued job ends CANCELLED at once, a running job goes CANCELLING;
        a sweep stops its running trials). A run that already ended: ``Conflict``."""
        return self._refresh(self._http.request("POST", f"{self._path}/cancel").json())


def log_lines(
    transport: Transport,
    path: str,
    *,
    follow: bool = False,
    attempt: int | None = None,
    tail: int | None = None,
    rank: int | None = None,
) -> Iterator[str]:
    """A run's output as lines without their newline. ``follow``: streamed as the run prints, until it ends."""
    params = {"attempt": attempt, "tail": tail, "rank": rank}
    if not follow:
        text = transport.request("GET", path, params=params, headers={"Accept": "text/plain"}).text
        yield from text.splitlines()
        return
    with transport.stream("GET", path, params={**params, "follow": True}) as response:
        yield from response.iter_lines()


def find_by_ref(
    transport: Transport,
    kind: str,
    collection: str,
    ref: str,
    parse: Callable[[Any], R],
    name_of: Callable[[R], str],
    id_of: Callable[[R], str],
) -> R:
    """``ref`` as an id; else the one run whose name starts with it (``?name_prefix=``), or the one named exactly
    ``ref``. None matching: the 404; several: Conflict listing them (``candidates``: their ids)."""
    if not ref:
        raise ValueError(f"a {kind} id or name prefix is required")
    try:
        return parse(transport.request("GET", f"{collection}/{quote(ref, safe='')}").json())
    except NotFound as missing:
        pager = Pager(transport, collection, parse, params={"name_prefix": ref}, limit=MAX_CANDIDATES + 1)
        # the name check again, here: a server older than ?name_prefix= answers every run, unfiltered
        matches = [run for run in pager if name_of(run).startswith(ref)]
        if not matches:
            missing.message = f"no {kind} with id {ref!r} or a name starting with it"
            raise
        exact = [run for run in matches if name_of(run) == ref]
        if len(exact) == 1:  # "resnet" names one job even while "resnet-2" exists
            return exact[0]
        if len(matches) > 1:
            shown = ", ".join(f"{id_of(run)} ({name_of(run)})" for run in matches[:MAX_CANDIDATES])
            more = " and more" if len(matches) > MAX_CANDIDATES else ""
            raise Conflict(
                f"{len(matches) if not more else 'several'} {kind}s have a name starting with {ref!r}: {shown}{more}; "
                "give an id or a longer prefix",
                candidates=[id_of(run) for run in matches],
            ) from None
        return matches[0]
