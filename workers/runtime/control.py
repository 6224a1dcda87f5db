"""Rank 0 asks the control plane, now and then, whether its job (its sweep) is preempted (docs/scheduling.md).

A daemon thread polls ``GET {url}/internal/v1/jobs/{job_id}/control?attempt=N`` with the run's token every
``ORCHESTRATOR_CONTROL_POLL_S`` seconds (default 1) and latches ``checkpoint_now`` once it is true. It never
blocks training: the loop only reads the flag, and every rank learns rank 0's answer at its next optimizer
step (``workers.runtime.train_loop``). An unreachable control plane, or any answer but a 2xx, just means
"no news": a preempted job that never hears of it is stopped all the same after the grace.

The same poll answers hang detection (docs/jobs.md "Hangs"): every rank of a job polls (rank 0 as above, the
others every ``ORCHESTRATOR_STACKS_POLL_S``, default 5) and, when the control plane found no progress and sets
``stacks_wanted``, prints its threads' stacks to the attempt's log and posts them (``workers.runtime.stacks``).

A sweep trial's rank 0 polls its sweep's ``/internal/v1/sweeps/{sweep_id}/control`` with the sweep's token
(``sweep_control`` in its config, set by ``workers.tune``), and so does the sweep driver
(``workers.tune.preemption``): a trial reports to no control plane of its own, but stops as a job does. Where
hang detection watches the trial (its base's ``failure.hang_timeout_s``, on by default), every rank of it polls
there too: it answers its trial's ``trial_stacks_wanted``, and ends its own process when the control plane
names it in ``end_workers`` (the trial is hung: Ray Train restarts its workers from the latest checkpoint).

``SharedFlag`` carries rank 0's answer to every rank without slowing a step: a blocking all-reduce of one
number per step cost 2.4 ms a step on 2 CPU ranks here (1.5x the time of a tiny digits run), so the
all-reduce of step t runs in the background (on a CPU gloo group, never a GPU stream) and is read after
step t + 1: every rank stops at the same step, one step after rank 0 heard.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import uuid

import httpx
import torch
import torch.distributed as dist

from orchestrator_contract.jobs import ControlSignal
from orchestrator_contract.logs import stacks_line_prefix
from workers.runtime import stacks
from workers.runtime.claim import RunToken, bearer

log = logging.getLogger(__name__)

DEFAULT_POLL_S = 1.0
DEFAULT_STACKS_POLL_S = 5.0
REQUEST_TIMEOUT_S = 5.0
HUNG_EXIT_CODE = 75  # a hung trial's worker, ended on the control plane's word (EX_TEMPFAIL: retried)


def poll_interval_s(variable: str = "ORCHESTRATOR_CONTROL_POLL_S", default: float = DEFAULT_POLL_S) -> float:
    try:
        return max(0.05, float(os.environ.get(variable, default)))
    except ValueError:
        return default


def stacks_poll_interval_s() -> float:
    """How often a rank but rank 0 asks whether its stacks are wanted (rank 0 asks with its preemption poll)."""
    return poll_interval_s("ORCHESTRATOR_STACKS_POLL_S", DEFAULT_STACKS_POLL_S)


class ControlPoller:
    """Asks the control plane what it wants of this attempt, every ``interval_s``: with ``preemption``,
    ``checkpoint_now`` becomes True (and stays) once it is asked for; with ``stacks_rank``, each new
    ``stacks_wanted`` is answered once with this rank's stacks (``workers.runtime.stacks``), printed to the attempt's
    log and posted as a ``StacksEvent``. Made on the training thread: its stack is the one that says where the rank
    is."""

    def __init__(
        self,
        url: str,
        job_id: str,
        attempt: int,
        token: RunToken | str,
        interval_s: float | None = None,
        collection: str = "jobs",
        *,
        preemption: bool = True,
        stacks_rank: int | None = None,
        trial: str | None = None,
        stacks_trial: str | None = None,
    ) -> None:
        base = f"{url.rstrip('/')}/internal/v1/{collection}/{job_id}"
        self._endpoint, self._events = f"{base}/control", f"{base}/events"
        self._attempt = attempt
        self._headers = bearer(token)
        self._interval_s = interval_s if interval_s is not None else poll_interval_s()
        self._preemption = preemption
        self._stacks_rank = stacks_rank
        self._trial = trial  # a sweep trial with a deadline: its Ray Tune id, looked for in ``stop_trials``
        self.deadline = False  # checkpoint_now is this trial's deadline, not a preemption
        self._stacks_trial = stacks_trial  # a sweep trial's rank: its Ray Tune id, for its requests for stacks
        self.worker = uuid.uuid4().hex[:16]  # this process's id in its answers, for ControlSignal.end_workers
        self._training = threading.get_ident()
        self._answered: set[str] = set()
        self._requested = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"control-poller-{job_id}", daemon=True)
        self._thread.start()

    @property
    def checkpoint_now(self) -> bool:
        return self._requested.is_set()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=REQUEST_TIMEOUT_S + 1)

    def _run(self) -> None:
        with httpx.Client(headers=self._headers, timeout=REQUEST_TIMEOUT_S) as client:
            while not self._stop.wait(self._interval_s):
                signal = self._ask(client)
                if signal is None:
                    continue
                if self._trial is not None and self._trial in signal.stop_trials and not self._requested.is_set():
                    log.info(
                        "this trial is past its deadline (max_runtime_s): checkpointing at the next step, then stopping"
                    )
                    self.deadline = True
                    self._requested.set()
                    if self._stacks_rank is None:
                        return
                if self._preemption and signal.checkpoint_now and not self._requested.is_set():
                    log.info("the control plane preempted this run: checkpointing at the next step, then stopping")
                    self._requested.set()
                    if self._stacks_rank is None:
                        return
                trial = self._stacks_trial
                wanted = signal.stacks_wanted if trial is None else signal.trial_stacks_wanted.get(trial)
                if self._stacks_rank is not None and wanted and wanted not in self._answered:
                    self._answer_stacks(client, wanted)
                if trial is not None and self.worker in signal.end_workers:
                    self._end_process()

    def _ask(self, client: httpx.Client) -> ControlSignal | None:
        """The control plane's answer; None for "no news" (unreachable, not a 2xx, not a signal)."""
        try:
            response = client.get(self._endpoint, params={"attempt": self._attempt})
        except httpx.HTTPError:
            return None
        if not response.is_success:
            return None
        try:
            return ControlSignal.model_validate(response.json())
        except ValueError:
            return None

    def _answer_stacks(self, client: httpx.Client, request: str) -> None:
        """Print this rank's stacks to the attempt's log and post them; answered once, or again at the next poll
        if the post did not get through."""
        answer = {**stacks.answer(request, self._stacks_rank, self._training), "worker": self.worker}
        if self._stacks_trial is not None:
            answer["trial"] = self._stacks_trial
        prefix = stacks_line_prefix(self._stacks_rank)  # Ray's log dedup lets these through (DEDUP_ALLOW)
        header = (
            f"the control plane found no progress and asked for this rank's stacks (rank {self._stacks_rank}, "
            f"pid {answer['pid']}, node {answer['node']}, "
            f"{'in a collective' if answer['in_collective'] else 'not in a collective'}):"
        )
        lines = [header, *answer["stacks"].splitlines()]
        print("\n".join(prefix + line for line in lines), file=sys.stderr, flush=True)
        try:
            response = client.post(self._events, json={"attempt": self._attempt, "events": [answer]})
        except httpx.HTTPError:
            return
        if response.is_success:
            self._answered.add(request)

    def _end_process(self) -> None:
        """The control plane found this trial hung and names this worker: end the process, so Ray Train sees its
        worker die and restarts the trial's workers from its latest checkpoint (``retries.max_worker_restarts``).
        From this thread: the training thread is the one that hangs."""
        print(
            f"{stacks_line_prefix(self._stacks_rank or 0)}the control plane found trial {self._stacks_trial} hung "
            f'(docs/jobs.md "Hangs"): ending worker process {os.getpid()} so Ray Train restarts the trial\'s workers '
            "from its latest checkpoint",
            file=sys.stderr,
            flush=True,
        )
        os._exit(HUNG_EXIT_CODE)


def control_target(config: dict) -> tuple[str, str, str, int, RunToken | str] | None:
    """Where this run asks whether it is preempted, ``(url, collection, id, attempt, token)``: a sweep trial
    its sweep's control (``sweep_control``), a job reporting to a control plane its own; None for a run that
    cannot be preempted (``preemptible: false``, scripts, a sweep that is not preemptible)."""
    if (config.get("spec") or {}).get("preemptible") is False:
        return None
    sweep = config.get("sweep_control")
    if sweep:  # a trial: its sweep's preemption, unless the sweep cannot be preempted
        return _sweep_target(config) if sweep.get("preemptible", True) else None
    return _own_control(config)


def _own_control(config: dict) -> tuple[str, str, str, int, RunToken | str] | None:
    """A job's own control endpoint when it reports to a control plane (not a sweep's trial, not a script)."""
    url, token = config.get("control_plane_url"), config.get("token")
    if url and token and not config.get("sweep_control"):
        return url, "jobs", config["job_id"], int(config["attempt"]), token
    return None


def control_poller(config: dict, rank: int) -> ControlPoller | None:
    """This rank's poller, made on its training thread: rank 0's hears a preemption (``control_target``) every
    ``ORCHESTRATOR_CONTROL_POLL_S``; every rank of a job answers a request for its stacks (rank 0 at that
    interval, the others every ``ORCHESTRATOR_STACKS_POLL_S``). None where nothing is polled (a rank of a
    trial but rank 0, scripts)."""
    preemption = control_target(config) if rank == 0 else None
    own = _own_control(config)
    trial = _trial_with_deadline(config) if rank == 0 else None
    stacks_trial = _trial_watched_for_hangs(config)
    target = preemption or own or (_sweep_target(config) if trial or stacks_trial else None)
    if target is None:
        return None
    url, collection, run_id, attempt, token = target
    interval = None if rank == 0 else stacks_poll_interval_s()
    stacks_rank = rank if own is not None or stacks_trial is not None else None
    return ControlPoller(
        url,
        run_id,
        attempt,
        token,
        interval,
        collection=collection,
        preemption=preemption is not None,
        stacks_rank=stacks_rank,
        trial=trial,
        stacks_trial=stacks_trial,
    )


def _sweep_target(config: dict) -> tuple[str, str, str, int, RunToken | str]:
    sweep = config["sweep_control"]
    return sweep["url"], "sweeps", sweep["sweep_id"], int(sweep["attempt"]), sweep["token"]


def _trial_with_deadline(config: dict) -> str | None:
    """A sweep trial's Ray Tune id when it has a deadline of its own (its base's ``max_runtime_s``): its rank 0
    then polls the sweep's control for ``stop_trials``, preemptible or not (a deadline is no preemption)."""
    sweep = config.get("sweep_control") or {}
    if sweep.get("trial") and (config.get("spec") or {}).get("max_runtime_s") is not None:
        return str(sweep["trial"])
    return None


def _trial_watched_for_hangs(config: dict) -> str | None:
    """A sweep trial's Ray Tune id when hang detection watches it (its base's ``failure.hang_timeout_s`` is not
    null): each of its ranks then answers the sweep's requests for its stacks (``trial_stacks_wanted``)."""
    sweep = config.get("sweep_control") or {}
    failure = (config.get("spec") or {}).get("failure") or {}
    if sweep.get("trial") and failure.get("hang_timeout_s", "auto") is not None:
        return str(sweep["trial"])
    return None


class SharedFlag:
    """Rank 0's flag, learnt by every rank one step later: each ``exchange`` reads the asynchronous
    all-reduce the previous one started, then starts the next. Every rank must call it at the same steps
    (the loop calls it once per optimizer step on every rank)."""

    def __init__(self, world_size: int) -> None:
        self.distributed = world_size > 1 and dist.is_available() and dist.is_initialized()
        # The flag never touches a GPU: on NCCL it goes through a gloo group of its own (made by every rank).
        self._group = dist.new_group(backend="gloo") if self.distributed and dist.get_backend() != "gloo" else None
        self._work = None
        self._value: torch.Tensor | None = None

    def exchange(self, local: bool) -> bool:
        """True once any rank (rank 0: the only one that polls) had the flag set at the previous exchange."""
        if not self.distributed:
            return local
        agreed = False
        if self._work is not None:
            self._work.wait()
            self._work = None
            agreed = bool(self._value.item() > 0)
        if not agreed:
            self._value = torch.tensor([1.0 if local else 0.0], dtype=torch.float64)
            self._work = dist.all_reduce(self._value, group=self._group, async_op=True)
        return agreed

    def close(self) -> None:
        """Wait for the exchange still in flight (every rank started it), before the group is used for more."""
        if self._work is not None:
            self._work.wait()
            self._work = None
