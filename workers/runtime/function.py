"""A training function that owns its loop (a job spec's ``entrypoint``, ``"train:main"``): ``main(ctx)``.

``run_function`` runs it on every rank, as ``run_training`` runs a workload, and on the same ``LoopContext``
(``workers.runtime.context``): ``RayContext`` on a Ray Train worker, ``LocalContext`` in one process or under
``torch.multiprocessing``. The ``TrainContext`` it hands to ``main`` is a thin layer over it:

- ``rank``, ``world_size``, ``device``, ``config`` (the spec's ``config``), and from the spec and its plan
  ``epochs``, ``lr`` (scaled to the global batch), ``batch_size`` (per worker), ``seed``, ``strategy``,
  ``precision``, and ``spec`` itself;
- ``prepare(model)``: sync BatchNorm, the device, DDP or FSDP2, with the loop's own code (``prepare_model``);
- ``shard(dataset, batch_size)``: a DataLoader over a ``DistributedSampler`` whose ``set_epoch`` is called
  on every new iteration (after a restore, iterations go on from the checkpoint's epoch);
- ``report(metrics, checkpoint_dir=None, *, epoch=None, step=None)``: metrics to the control plane from rank 0
  (the loop's ``EventReporter``); ``epoch`` and ``step`` in ``metrics`` (Ray Train's idiom) are the report's
  position, as the keywords are (``report_position``); with a folder (every rank its own, every rank calls
  it), a committed checkpoint through the ``LoopContext``, with a manifest so that a resume verifies it;
- stragglers: the model ``prepare`` returns and the loader ``shard`` returns time this rank's own part of each
  step (its training forwards, its waits for batches; ``workers.runtime.stragglers.FunctionOwnTime``), and rank 0's
  reports carry every rank's (a sweep trial's: its checkpoint reports, the epoch results Ray Tune gets, each
  rank's since the one before, under ``RANK_STEP_S_KEY``);
- ``restore()``: a local folder holding the latest committed checkpoint that verifies, or None;
- ``should_preempt()``: True once the control plane asked the job to give its workers back (docs/scheduling.md), on every
  rank at the same call (rank 0's ``ControlPoller``, carried to the others by a ``SharedFlag``): save a
  checkpoint with ``report`` and return; the driver then exits ``DriverExit.PREEMPTED`` and the job is requeued,
  as the built-in loop's. Every rank must call it at the same points (it is a collective, like ``report``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import numbers
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from orchestrator_contract.jobs import JobSpec, MetricsEvent, StateEvent, TrainingPlan
from orchestrator_contract.metrics import DEFAULT_MAX_METRIC_NAMES, POSITION_KEYS, check_metric_name
from orchestrator_contract.sweeps import RANK_STEP_S_KEY
from orchestrator_contract.workloads import load_entrypoint
from workers.runtime.blocking import CheckpointBlocking
from workers.runtime.context import LoopContext
from workers.runtime.control import SharedFlag, control_poller
from workers.runtime.distributed import unwrap
from workers.runtime.manifest import MANIFEST_DIR, manifest_name, write_manifest
from workers.runtime.rng import seed_everything
from workers.runtime.step import autocast, prepare_model
from workers.runtime.stragglers import FunctionOwnTime
from workers.runtime.train_loop import EPOCH_RANK_TIMES, Reporter, rank0_reporter, reached, stopped

log = logging.getLogger(__name__)

# Rank 0 writes it into every checkpoint: where the context's counters stood, so a restore goes on from there.
CONTEXT_FILE = "context.json"


def run_function(config: dict, ctx: LoopContext, reporter: Reporter | None = None) -> dict[str, float]:
    """Run the spec's training function on this rank; returns the last metrics it reported (rank 0's, with
    ``epoch`` and ``step``), which the driver reports as the job's result; with ``PREEMPTED_KEY`` (the step) when
    ``main`` returned after ``should_preempt()`` said True: the driver then reports no outcome and exits
    ``DriverExit.PREEMPTED``, as for the built-in loop. ``config`` as ``run_training``'s."""
    spec = JobSpec.model_validate(config["spec"])
    plan = TrainingPlan.model_validate(config["plan"])
    assert spec.entrypoint is not None, "a workload job runs the training loop"
    torch.set_num_threads(max(1, int(spec.scaling.cpus_per_worker)))
    seed_everything(spec.seed)  # the same on every rank: the same initial weights, unless main reseeds
    main = load_entrypoint(spec.entrypoint)
    # Rank 0 listens for a preemption (a job reporting to a control plane, preemptible); the others learn its
    # answer through should_preempt's SharedFlag. Every rank of a job answers a request for its stacks.
    poller = control_poller(config, ctx.rank)
    with rank0_reporter(config, ctx.rank, reporter) as reporter, ctx.resume_dir() as resume_dir:
        # Chosen before main runs, on every rank together (rank 0 verifies, all take its choice), and kept
        # until main returns: restore() is then a plain look-up any rank may make, or not.
        train_ctx = TrainContext(
            spec, plan, ctx, reporter, resume_dir, poller, epoch_rank_times=bool(config.get(EPOCH_RANK_TIMES))
        )
        if reporter is not None:
            reporter.emit(StateEvent(state="running", rank_nodes=ctx.rank_nodes))
        reached(reporter, "training_started")  # its start-up timeline: main begins (first_step: its first report)
        try:
            main(train_ctx)
        finally:
            if poller is not None:
                poller.close()
        train_ctx.close()
        result = train_ctx.result()
        if train_ctx.preempted:
            log.info("preempted: main returned at step %d after should_preempt(); stopping", train_ctx.step)
            return {**result, **stopped(train_ctx.step, poller)}
        return result


class TrainContext:
    """What ``main(ctx)`` gets (the module docstring lists it)."""

    def __init__(
        self,
        spec: JobSpec,
        plan: TrainingPlan,
        loop: LoopContext,
        reporter: Reporter | None,
        resume_dir: str | None,
        poller=None,  # rank 0's ControlPoller, when the job can be preempted
        epoch_rank_times: bool = False,  # a sweep trial's (train_loop.EPOCH_RANK_TIMES): times in its epoch results
    ) -> None:
        self.spec, self.plan, self._loop, self._reporter = spec, plan, loop, reporter
        self.rank, self.world_size, self.device = loop.rank, loop.world_size, loop.device
        self.config: dict[str, Any] = dict(spec.config)
        self.epochs, self.lr, self.seed = spec.epochs, plan.lr, spec.seed
        self.batch_size = spec.batch.per_worker
        self.strategy, self.precision = plan.strategy, spec.precision
        self._resume_dir = resume_dir
        self.epoch, self.step = 0, 0  # the last epoch begun by a shuffled shard, the last report's step
        if resume_dir is not None and (Path(resume_dir) / CONTEXT_FILE).is_file():
            position = json.loads((Path(resume_dir) / CONTEXT_FILE).read_text())
            self.epoch, self.step = int(position["epoch"]), int(position["step"])
        self._start_epoch = self.epoch
        self._names: set[str] = set()
        self._last: dict[str, float] = {}
        self._reported = False  # a first report made (the start-up timeline's first_step)
        self._poller = poller
        self._in_flight: dict[str, Any] | None = None  # the metrics of an asynchronous checkpoint not yet committed
        # Made on every rank (on NCCL a gloo group of its own: a collective), used only when main asks.
        self._flag = SharedFlag(self.world_size)
        self._own_time = FunctionOwnTime(self.device, self.rank, self.world_size)  # stragglers: see its docstring
        self._epoch_rank_times = epoch_rank_times
        self.preempted = False  # should_preempt() said True: main is expected to checkpoint and return
        self._blocking = CheckpointBlocking()  # since the last metric point (goodput)

    # --- the model and the data ---------------------------------------------------------------------

    def prepare(
        self, model: nn.Module, fsdp_blocks: Callable[[nn.Module], Iterable[nn.Module]] | None = None
    ) -> nn.Module:
        """``model`` on the device and wrapped as the plan says: DDP, or FSDP2 (each of ``fsdp_blocks(model)``
        sharded first, then the root); sync BatchNorm with ``sync_batchnorm``. Build the optimizer after."""
        prepared = prepare_model(model, self.spec, self.plan, self.device, self.world_size, fsdp_blocks)
        self._own_time.attach(prepared)
        return prepared

    @staticmethod
    def unwrap(model: nn.Module) -> nn.Module:
        """The user's module inside DDP (what to save as ``model.pt``); an FSDP2 model is its own."""
        return unwrap(model)

    def autocast(self) -> contextlib.AbstractContextManager:
        """The spec's precision around a forward pass (bf16/fp16 autocast; nothing for fp32)."""
        return autocast(self.precision, self.device)

    def shard(
        self,
        dataset: Dataset,
        batch_size: int | None = None,
        *,
        shuffle: bool = True,
        drop_last: bool = True,
        **loader_kwargs: Any,
    ) -> ShardedLoader:
        """This rank's share of ``dataset`` (``batch_size``: default the spec's ``batch.per_worker``): every
        iteration is one epoch, reshuffled with ``set_epoch`` (the same order on every run with the same seed)."""
        return ShardedLoader(
            self,
            dataset,
            batch_size=batch_size or self.batch_size,
            shuffle=shuffle,
            drop_last=drop_last,
            **loader_kwargs,
        )

    # --- reporting and checkpoints ------------------------------------------------------------------

    def report(
        self,
        metrics: dict[str, Any],
        checkpoint_dir: str | Path | None = None,
        *,
        epoch: int | None = None,
        step: int | None = None,
    ) -> None:
        """Store ``metrics`` (rank 0's; scalars) at ``epoch`` (default: the shard's current epoch) and ``step``
        (default: one more than the last report's). ``epoch`` and ``step`` may also be keys of ``metrics``, as
        Ray Train's ``train.report`` users write them (``report_position``). With ``checkpoint_dir``, every rank
        calls it with its own folder of its part of the checkpoint, and together they become one committed
        checkpoint."""
        metrics, epoch, step = report_position(metrics, epoch, step)
        values = self._checked(metrics)
        if not self._reported:  # its first report: the last stage of the attempt's start
            self._reported = True
            reached(self._reporter, "first_step")
        self.epoch = self.epoch if epoch is None else epoch
        self.step = self.step + 1 if step is None else step
        if self._reporter is not None and values:
            self._reporter.emit(
                MetricsEvent(
                    epoch=max(self.epoch, 0),
                    step=max(self.step, 0),
                    values=values,
                    # A trial's go with its checkpoint reports, the results Tune gets (``_checkpoint``).
                    rank_step_s=None if self._epoch_rank_times else self._own_time.gather(),
                    checkpoint_blocked_s=self._blocking.take(),
                )
            )
        self._last = values
        if checkpoint_dir is None:
            return
        with self._blocking.timed():  # goodput's checkpoint blocking: from here to the return, on every rank
            self._checkpoint(Path(checkpoint_dir), values)

    def _checkpoint(self, folder: Path, values: dict[str, float]) -> None:
        if not folder.is_dir():
            raise ValueError(f"checkpoint_dir {str(folder)!r} is not a folder: write the checkpoint's files into one")
        others = [p.name for p in (folder / MANIFEST_DIR).glob("rank-*.json") if p.name != manifest_name(self.rank)]
        if others:
            raise ValueError(
                f"checkpoint_dir {str(folder)!r} holds another rank's part ({others[0]}): give every rank its own "
                "folder (e.g. tempfile.TemporaryDirectory())"
            )
        if self.rank == 0:
            (folder / CONTEXT_FILE).write_text(json.dumps({"epoch": self.epoch, "step": self.step}))
        write_manifest(folder, rank=self.rank, world_size=self.world_size)  # last: it lists the files above
        reported: dict[str, Any] = {**values, "epoch": self.epoch, "step": self.step}
        if self._epoch_rank_times and self.rank == 0:  # only rank 0's report is the trial's result
            rank_step_s = self._own_time.gather()  # since the previous checkpoint report; None: not every rank yet
            if rank_step_s is not None:
                reported[RANK_STEP_S_KEY] = rank_step_s
        # The preemption's checkpoint is the one the next attempt resumes from: registered before main returns.
        wait = self.spec.checkpoint.wait_for_commit or self.preempted
        if self.spec.checkpoint.async_ and not wait:
            # The folder is the caller's again when report returns (a TemporaryDirectory, most often): a local
            # copy is uploaded in the background, and deleted after (checkpoint.async).
            copy = tempfile.mkdtemp(prefix="checkpoint-")
            shutil.copytree(folder, copy, dirs_exist_ok=True)
            self._loop.report(reported, copy, asynchronous=True)
            self._in_flight = reported
            return
        self._loop.report(reported, str(folder))
        self._in_flight = None
        if wait:
            self._loop.wait_committed(reported)

    def should_preempt(self) -> bool:
        """True once the control plane asked this job to give its workers back: save a checkpoint (``report``
        with ``checkpoint_dir``) and return from ``main``. Cheap enough to call every step (the answer travels
        in the background: other ranks see rank 0's a call later), but every rank must call it at the same
        points, as it is a collective; once True it stays True. Always False for a job that cannot be preempted
        (``preemptible: false``) or reports to no control plane (``torchrun``); on ``LocalContext``, set its
        ``preempt_requested`` (rank 0's) to play the control plane."""
        if not self.preempted:
            local = (self._poller is not None and self._poller.checkpoint_now) or bool(
                getattr(self._loop, "preempt_requested", False)
            )
            self.preempted = self._flag.exchange(local)
        return self.preempted

    def close(self) -> None:
        """After main returned on every rank: wait for should_preempt's exchange still in flight, and for the last
        checkpoint's upload (the run's result names it)."""
        self._flag.close()
        if self._in_flight is not None:
            with self._blocking.timed():
                self._loop.wait_committed(self._in_flight)
            self._in_flight = None
        self._blocking.flush(self._reporter, max(self.epoch, 0), max(self.step, 0))

    def restore(self) -> str | None:
        """A local folder holding the latest committed checkpoint (that verifies), or None on a fresh start.
        Read-only, and only until ``main`` returns."""
        return self._resume_dir

    def result(self) -> dict[str, float]:
        return {**self._last, "epoch": self.epoch, "step": self.step}

    def _checked(self, metrics: dict[str, Any]) -> dict[str, float]:
        values = {}
        for name, value in metrics.items():
            check_metric_name(name)
            values[name] = _scalar(name, value)
        new = values.keys() - self._names
        if len(self._names) + len(new) > DEFAULT_MAX_METRIC_NAMES:
            raise ValueError(
                f"this run would report {len(self._names) + len(new)} distinct metric names, at most "
                f"{DEFAULT_MAX_METRIC_NAMES}: report fewer (new here: {sorted(new)[:5]})"
            )
        self._names |= new
        return values

    def _begin_epoch(self, epoch: int) -> None:
        self.epoch = max(self.epoch, epoch)


def report_position(
    metrics: dict[str, Any], epoch: Any = None, step: Any = None
) -> tuple[dict[str, Any], int | None, int | None]:
    """``ctx.report``'s arguments as (the metrics without ``epoch`` and ``step``, the epoch, the step), each
    position None where neither the keyword nor the dict gives it. The one reading of a report's position for
    every context (``LocalContext``, ``RayContext``, ``torchrun``): ``report({"loss": l, "epoch": e})``, Ray
    Train's idiom, means ``report({"loss": l}, epoch=e)``. A position given both ways must agree (ValueError
    otherwise: which one was meant?); each is a whole number from 0."""
    if not isinstance(metrics, dict):
        raise ValueError(f"ctx.report takes a dict of metric name to number, not {type(metrics).__name__}")
    given = {"epoch": epoch, "step": step}
    for name in POSITION_KEYS & metrics.keys():
        in_dict = _whole_number(name, metrics[name])
        keyword = given[name]
        if keyword is not None and _whole_number(name, keyword) != in_dict:
            raise ValueError(
                f"ctx.report got {name}={keyword} and {{{name!r}: {metrics[name]}}} in the metrics: give the "
                f"{name} once (either way), or the same in both"
            )
        given[name] = in_dict
    values = {name: value for name, value in metrics.items() if name not in POSITION_KEYS}
    epoch, step = (None if given[k] is None else _whole_number(k, given[k]) for k in ("epoch", "step"))
    return values, epoch, step


def _whole_number(name: str, value: Any) -> int:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"{name} is a tensor of {value.numel()} elements: a whole number from 0")
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} is {type(value).__name__}: a whole number from 0")
    if not (isinstance(value, numbers.Integral) or float(value).is_integer()) or value < 0:
        raise ValueError(f"{name} is {value}: a whole number from 0")
    return int(value)


def _scalar(name: str, value: Any) -> float:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"metric {name!r} is a tensor of {value.numel()} elements: report one number")
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"metric {name!r} is {type(value).__name__}: report a number")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"metric {name!r} is {value}: only finite numbers are stored")
    return value


class ShardedLoader(DataLoader):
    """A DataLoader over a ``DistributedSampler``: each ``iter()`` is the next epoch (``set_epoch`` done).
    ``epoch``: the sampler epoch the next iteration uses (from 0; after a restore, the checkpoint's epoch)."""

    def __init__(
        self, ctx: TrainContext, dataset: Dataset, *, batch_size: int, shuffle: bool, drop_last: bool, **kwargs
    ):
        sampler = DistributedSampler(
            dataset, num_replicas=ctx.world_size, rank=ctx.rank, shuffle=shuffle, seed=ctx.seed, drop_last=drop_last
        )
        # Its own generator: creating an iterator draws a seed, which must not shift the global RNG's draws.
        kwargs.setdefault("generator", torch.Generator())
        super().__init__(dataset, batch_size=batch_size, sampler=sampler, **kwargs)
        self._ctx = ctx
        self.epoch = ctx._start_epoch

    def __iter__(self) -> Iterator[Any]:
        self.sampler.set_epoch(self.epoch)
        if self.sampler.shuffle:  # a training pass: the context's epoch (1-based) for report()
            self._ctx._begin_epoch(self.epoch + 1)
        self.epoch += 1
        if self.sampler.shuffle:  # a training pass: waits for its batches are this rank's own time
            return self._ctx._own_time.batches(super().__iter__())
        return super().__iter__()
