"""The one training loop, run on every worker for every workload.

``config`` carries ``job_id``, ``attempt``, ``control_plane_url``, ``token``, ``spec`` (a JobSpec as a
dict) and ``plan`` (its TrainingPlan: the resolved strategy and the scaled learning rate). Rank 0
reports a ``running`` state, step metrics every ``spec.metrics_every_steps`` optimizer steps and
epoch metrics to the control plane (non-blocking). Checkpoints are the only reports to the context
(``ray.train.report`` blocks): every ``checkpoint.every_epochs`` epochs, every
``checkpoint.every_steps`` optimizer steps and after the last epoch.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import tempfile
import time
from collections.abc import Iterator
from typing import Any, Protocol

import torch

from orchestrator_contract.jobs import JobSpec, MetricsEvent, StartupEvent, StateEvent, TrainingPlan
from orchestrator_contract.sweeps import RANK_STEP_S_KEY
from workers.runtime.blocking import CheckpointBlocking
from workers.runtime.checkpoint_io import Position, checkpoint_state, restore_checkpoint, save_checkpoint
from workers.runtime.checkpoint_writer import CheckpointWriter
from workers.runtime.context import LoopContext
from workers.runtime.control import SharedFlag, control_poller, control_target
from workers.runtime.data import TrainBatches, val_batches
from workers.runtime.distributed import all_reduce_sum, is_distributed, unwrap
from workers.runtime.reporter import EventReporter
from workers.runtime.rng import rank_seed, seed_everything
from workers.runtime.step import TrainState, adopt_lr, autocast, build_train_state, optimizer_step
from workers.runtime.stragglers import OwnTime
from workers.runtime.validation import metric_names, weighted_sums
from workers.workloads import Workload, load_workload
from workers.workloads.base import flat_accuracy

log = logging.getLogger(__name__)

FINAL_FLUSH_TIMEOUT_S = 30.0


class Reporter(Protocol):
    def emit(self, event: Any) -> None: ...
    def flush(self, timeout_s: float) -> bool: ...
    def close(self) -> None: ...


PREEMPTED_KEY = "preempted_at_step"  # in ``run_training``'s result: it checkpointed and stopped there
DEADLINE_KEY = "deadline_exceeded"  # with PREEMPTED_KEY: the stop was a sweep trial's deadline, not a preemption
# In the config: true for a sweep trial's run (``workers.tune.tuner``), whose rank 0 reports to no control plane but
# to Ray Tune: its epoch results carry each rank's own seconds per step over the epoch (``RANK_STEP_S_KEY``, a list),
# what a job's metric windows send (``MetricsEvent.rank_step_s``; docs/jobs.md "Stragglers").
EPOCH_RANK_TIMES = "epoch_rank_step_s"


def stopped(step: int, poller) -> dict:
    """The result of a run that checkpointed at ``step`` and stopped when rank 0's ``poller`` heard so."""
    return {PREEMPTED_KEY: step, **({DEADLINE_KEY: True} if getattr(poller, "deadline", False) else {})}


class Preempted(Exception):
    """Raised inside the loop once the preemption checkpoint is committed: training stops here."""


def run_training(config: dict, ctx: LoopContext, reporter: Reporter | None = None) -> dict[str, float]:
    """Train the job's workload; returns the last epoch's metrics and ``samples_per_s``, or, when the control
    plane preempted the job, ``{PREEMPTED_KEY: step}`` once a checkpoint of that step is committed.

    ``reporter`` receives rank 0's events; by default rank 0 builds an ``EventReporter`` from ``config``.
    """
    spec = JobSpec.model_validate(config["spec"])
    plan = TrainingPlan.model_validate(config["plan"])
    torch.set_num_threads(max(1, int(spec.scaling.cpus_per_worker)))
    with rank0_reporter(config, ctx.rank, reporter) as reporter:
        reached(reporter, "training_started")
        # The same seed on every rank for the model's initial weights: FSDP2 shards each rank's own copy.
        seed_everything(spec.seed)
        workload = load_workload(spec.workload)(spec.config, spec.seed)
        state = build_train_state(workload, spec, plan, ctx.device, ctx.world_size)
        batches = TrainBatches(
            workload.train_dataset,
            rank=ctx.rank,
            world_size=ctx.world_size,
            per_worker=spec.batch.per_worker,
            accumulation_steps=spec.batch.accumulation_steps,
            seed=spec.seed,
        )
        seed_everything(rank_seed(spec.seed, ctx.rank))  # dropout: different masks on each rank
        reached(reporter, "data_ready")
        # Every rank knows (from the same config) whether rank 0 listens for a preemption: then all of them
        # learn its answer at each step, so they checkpoint and stop at the same one.
        watched = control_target(config) is not None
        loop = _Loop(spec, plan, ctx, workload, state, batches, reporter)
        loop.background_checkpoints = config.get("background_checkpoints", True)
        loop.epoch_rank_times = bool(config.get(EPOCH_RANK_TIMES))
        loop.start_writer()
        with ctx.resume_dir() as resume_dir:
            if resume_dir:  # last: the RNG states it restores are the next ones drawn
                loop.resume(resume_dir)
        poller = control_poller(config, ctx.rank)  # every rank's: a preemption (rank 0), a request for stacks
        loop.watch(watched, poller)
        try:
            result = loop.run()
            loop.unwatch()
            return result
        except Preempted:
            return stopped(loop.position.step, poller)
        finally:
            if poller is not None:
                poller.close()


def reached(reporter: Reporter | None, stage: str) -> None:
    """Rank 0 tells the control plane a stage of the attempt's start is reached (docs/jobs.md "Start-up timeline");
    the other ranks (no reporter) say nothing."""
    if reporter is not None:
        reporter.emit(StartupEvent(stage=stage))


@contextlib.contextmanager
def rank0_reporter(config: dict, rank: int, reporter: Reporter | None = None) -> Iterator[Reporter | None]:
    """The job's one voice, rank 0's (None on other ranks): ``reporter``, or an ``EventReporter`` built from
    ``config`` and closed at the end; what is queued is flushed on the way out, whatever happened."""
    owns_reporter = False
    if rank != 0:
        reporter = None
    elif reporter is None:
        reporter = EventReporter(
            config.get("control_plane_url"), config["job_id"], config["attempt"], config.get("token", "")
        )
        owns_reporter = True
    try:
        yield reporter
    finally:
        if reporter is not None:
            if not reporter.flush(FINAL_FLUSH_TIMEOUT_S):
                log.warning("not every event reached the control plane within %.0fs", FINAL_FLUSH_TIMEOUT_S)
            if owns_reporter:
                reporter.close()


def epoch_line(epoch: int, epochs: int, step: int, metrics: dict[str, float], throughput: tuple[int, float]) -> str:
    """Rank 0's one line per epoch, what a person reads in the job's log:
    ``epoch 2/5 step 44: train_loss 0.2369, val_loss 0.2026, val_accuracy 0.9389, 13277 samples/s``."""
    samples, seconds = throughput
    values = ", ".join(f"{name} {value:.4g}" for name, value in metrics.items())
    return f"epoch {epoch}/{epochs} step {step}: {values}, {samples / max(seconds, 1e-9):.0f} samples/s"


class _Loop:
    def __init__(
        self,
        spec: JobSpec,
        plan: TrainingPlan,
        ctx: LoopContext,
        workload: Workload,
        state: TrainState,
        batches: TrainBatches,
        reporter: Reporter | None,
    ) -> None:
        self.spec, self.plan, self.ctx, self.workload = spec, plan, ctx, workload
        self.state, self.batches, self.reporter = state, batches, reporter
        self.samples_per_step = batches.samples_per_step * ctx.world_size
        self.position = Position(epoch=1, epoch_steps=0, step=0)
        self.epoch_loss = self._zeros(2)  # this rank's [sum of step losses, steps] in the epoch
        self.epoch_throughput: list[tuple[int, float]] = []  # (samples, seconds) per epoch run here
        self.metric_names: list[str] | None = None  # the workload's, checked at the first validation
        self.flag: SharedFlag | None = None  # set on every rank when rank 0 listens for a preemption
        self.poller = None  # this rank's ControlPoller (rank 0's hears a preemption)
        self.stop_after_epoch = False  # preempted at an epoch's last step: checkpoint at its end, then stop
        self.own_time = OwnTime(ctx.device)  # this rank's own time in the metric window (stragglers)
        self.epoch_rank_times = False  # a sweep trial's: each rank's own time over the epoch in its result
        self.stepped = False  # the first step is done ("first_step" of the start-up timeline)
        self.epoch_own = [0.0] * (ctx.world_size + 1)  # each rank's own seconds in the epoch's windows, their steps
        self.blocking = CheckpointBlocking()  # since the last metric point (goodput)
        self.writer = CheckpointWriter(ctx)  # asynchronous checkpoints: at most one in flight
        self.background_checkpoints = True  # False (sweep trials): checkpoint.async uploads in the background only

    def start_writer(self) -> None:
        """On every rank, before training: an FSDP run whose checkpoints are written in the background gives the
        writer a gloo group of its own for DCP's collectives (``dist.new_group`` is itself one, on every rank)."""
        fsdp = self.plan.strategy == "fsdp" and is_distributed()
        if fsdp and self.spec.checkpoint.async_ and self.background_checkpoints and self.writer.process_group is None:
            import torch.distributed as dist

            self.writer.process_group = dist.new_group(backend="gloo")

    def watch(self, watched: bool, poller) -> None:
        self.poller = poller
        self.flag = SharedFlag(self.ctx.world_size) if watched else None

    def unwatch(self) -> None:
        if self.flag is not None:
            self.flag.close()

    def _preempt_requested(self) -> bool:
        """Rank 0's flag on every rank, one step after rank 0 heard (``SharedFlag``: no step waits for it);
        only for a job that can be preempted."""
        if self.flag is None:
            return False
        return self.flag.exchange(self.poller is not None and self.poller.checkpoint_now)

    def _preemption_checkpoint(self, metrics: dict[str, Any]) -> None:
        """The checkpoint outside the schedule, committed (registered by Ray Train) before training stops."""
        self._timed_checkpoint(metrics, committed=True)
        if self.ctx.rank == 0:
            log.info("preempted: checkpointed at epoch %d, step %d; stopping", self.position.epoch, self.position.step)
        raise Preempted

    def resume(self, directory: str) -> None:
        position, epoch_loss = restore_checkpoint(
            directory, rank=self.ctx.rank, strategy=self.plan.strategy, state=self.state
        )
        log.info("resuming from %s at epoch %d, step %d", directory, position.epoch, position.step)
        if adopt_lr(self.state, self.plan.lr):  # another run's checkpoint, this run's rate (PBT)
            log.info("training on at this run's learning rate %.6g, not the checkpoint's", self.plan.lr)
        if position.epoch_steps >= self.batches.steps_per_epoch:  # taken at an epoch's end
            position = Position(position.epoch + 1, 0, position.step)
        elif epoch_loss is not None:
            self.epoch_loss = epoch_loss.to(self.ctx.device)
        self.position = position

    def run(self) -> dict[str, float]:
        spec = self.spec
        if self.reporter is not None:
            self.reporter.emit(StateEvent(state="running", rank_nodes=self.ctx.rank_nodes))
        if self.ctx.rank == 0:
            log.info(
                "%s, %s: global batch %d (%d per worker x %d workers x %d micro-batches), learning rate %.6g "
                "(%g for batch %d, %s scaling), %d warmup steps, %d steps per epoch",
                self.plan.strategy,
                spec.precision,
                self.samples_per_step,
                spec.batch.per_worker,
                self.ctx.world_size,
                spec.batch.accumulation_steps,
                self.plan.lr,
                spec.lr.base,
                spec.lr.base_batch,
                spec.lr.scaling,
                spec.lr.warmup_steps,
                self.batches.steps_per_epoch,
            )
            if self.plan.global_batch != self.samples_per_step:
                log.warning(
                    "the plan assumed a global batch of %d (and scaled the learning rate for it); this group makes %d",
                    self.plan.global_batch,
                    self.samples_per_step,
                )
        metrics: dict[str, float] = {}
        for epoch in range(self.position.epoch, spec.epochs + 1):
            self._train_epoch(epoch)
            metrics = self._epoch_metrics()
            if self.ctx.rank == 0:
                log.info("%s", epoch_line(epoch, spec.epochs, self.position.step, metrics, self.epoch_throughput[-1]))
            if self.reporter is not None:
                self.reporter.emit(
                    MetricsEvent(
                        epoch=epoch, step=self.position.step, values=metrics, checkpoint_blocked_s=self.blocking.take()
                    )
                )
            every_epochs, every_steps = spec.checkpoint.every_epochs, spec.checkpoint.every_steps
            reported = {**metrics, "samples_per_s": self.samples_per_s(), **self._epoch_rank_step_s()}
            if self.stop_after_epoch and epoch < spec.epochs:
                self._preemption_checkpoint(reported)
            if (
                epoch == spec.epochs
                or (every_epochs and epoch % every_epochs == 0)
                or (every_steps and self.position.step % every_steps == 0)  # deferred to here, with metrics
            ):
                self._timed_checkpoint(reported)
            self.position = Position(epoch + 1, 0, self.position.step)
            self.epoch_loss = self._zeros(2)
            self.epoch_own = [0.0] * (self.ctx.world_size + 1)
        self.writer.wait()  # nothing in flight once training ends
        self.blocking.flush(self.reporter, spec.epochs, self.position.step)
        return {**metrics, "samples_per_s": self.samples_per_s()}

    def samples_per_s(self) -> float:
        """Steady-state training throughput: every epoch run in this process but the first (warm-up)."""
        measured = self.epoch_throughput[1:] or self.epoch_throughput
        return sum(samples for samples, _ in measured) / max(sum(seconds for _, seconds in measured), 1e-9)

    # --- one epoch ----------------------------------------------------------------------------------

    def _train_epoch(self, epoch: int) -> None:
        spec, ctx = self.spec, self.ctx
        every_steps = spec.checkpoint.every_steps
        window = self._zeros(2)  # [sum of step losses, steps] since the last metrics point
        window_start = epoch_start = time.perf_counter()
        paused = 0.0  # seconds spent in mid-epoch checkpoints, not training
        steps_run = 0
        self.state.model.train()
        waiting_since = time.perf_counter()  # for this rank's next batch: its own time (stragglers)
        for micro_batches in self.batches.epoch(epoch, skip_steps=self.position.epoch_steps):
            self.own_time.add(time.perf_counter() - waiting_since)
            loss = optimizer_step(
                self.state,
                micro_batches,
                self.workload.loss_fn,
                device=ctx.device,
                precision=spec.precision,
                grad_clip_norm=spec.grad_clip_norm,
                own_time=self.own_time,
            )
            steps_run += 1
            if not self.stepped:  # this process's first step: the last stage of the attempt's start
                self.stepped = True
                reached(self.reporter, "first_step")
            self.position = Position(epoch, self.position.epoch_steps + 1, self.position.step + 1)
            counted = torch.stack([loss, torch.ones((), device=ctx.device)])
            window += counted
            self.epoch_loss += counted
            if self.position.step % spec.metrics_every_steps == 0:
                self._step_metrics(window, time.perf_counter() - window_start)
                window.zero_()
                window_start = time.perf_counter()
            if every_steps and self.position.step % every_steps == 0:
                if self.position.epoch_steps < self.batches.steps_per_epoch:  # else at the epoch's end
                    started = time.perf_counter()
                    self._timed_checkpoint({})
                    paused += time.perf_counter() - started
            if not self.stop_after_epoch and self._preempt_requested():
                if self.position.epoch_steps < self.batches.steps_per_epoch:
                    self._preemption_checkpoint({})
                self.stop_after_epoch = True  # the epoch's last step: its metrics and checkpoint come first
            waiting_since = time.perf_counter()
        if ctx.device.type == "cuda":
            torch.cuda.synchronize(ctx.device)  # the clock stops when the work is done, not queued
        seconds = time.perf_counter() - epoch_start - paused
        self.epoch_throughput.append((steps_run * self.samples_per_step, seconds))

    def _step_metrics(self, window: torch.Tensor, seconds: float) -> None:
        # A collective every N steps on every rank: the loss is the mean over all ranks, and each rank's own time
        # in its slot (every other rank adds 0 there).
        own = self._zeros(self.ctx.world_size)
        own[self.ctx.rank] = self.own_time.take()
        loss_sum, steps, *own_s = all_reduce_sum(torch.cat([window, own])).tolist()
        if self.epoch_rank_times:  # every rank adds the same sums: the epoch's result is the same on all
            self.epoch_own = [total + more for total, more in zip(self.epoch_own, [*own_s, steps], strict=True)]
        samples_per_s = steps / self.ctx.world_size * self.samples_per_step / max(seconds, 1e-9)
        values = {
            "train_loss": loss_sum / steps,
            "lr": self.state.scheduler.get_last_lr()[0],
            "samples_per_s": samples_per_s,
        }
        if self.workload.targets_per_sample > 1:
            values["tokens_per_s"] = samples_per_s * self.workload.targets_per_sample
        if self.reporter is not None:
            per_step = [seconds / max(steps / self.ctx.world_size, 1) for seconds in own_s]
            rank_step_s = per_step if self.ctx.world_size > 1 else None
            self.reporter.emit(
                MetricsEvent(
                    epoch=self.position.epoch,
                    step=self.position.step,
                    values=values,
                    rank_step_s=rank_step_s,
                    checkpoint_blocked_s=self.blocking.take(),
                )
            )

    def _epoch_rank_step_s(self) -> dict[str, list[float]]:
        """A sweep trial's (``EPOCH_RANK_TIMES``): each rank's own seconds per step over the epoch's metric windows,
        by rank, under ``RANK_STEP_S_KEY``; nothing for a job, one rank, or an epoch that ended no window."""
        *own_s, steps = self.epoch_own
        per_rank_steps = steps / self.ctx.world_size  # each rank counted its own steps
        if not self.epoch_rank_times or self.ctx.world_size < 2 or per_rank_steps <= 0:
            return {}
        return {RANK_STEP_S_KEY: [seconds / per_rank_steps for seconds in own_s]}

    def _epoch_metrics(self) -> dict[str, float]:
        # One collective for everything: the same length and order on every rank (names are sorted).
        sums = all_reduce_sum(torch.cat([self.epoch_loss, self._evaluate()]))
        train_loss, train_steps, val_loss, val_targets, *metric_sums = sums.tolist()
        targets = max(val_targets, 1)
        return {
            "train_loss": train_loss / max(train_steps, 1),
            "val_loss": val_loss / targets,
            **{name: total / targets for name, total in zip(self.metric_names or [], metric_sums, strict=True)},
        }

    @torch.no_grad()
    def _evaluate(self) -> torch.Tensor:
        """``[loss sum, targets, each metric's sum]`` over this rank's validation shard, each a mean of the
        batch weighed by its target count; the metrics are the workload's (``metric_names``' order)."""
        ctx = self.ctx
        # DDP's wrapper adds nothing to a forward without gradients; an FSDP2 module is its own wrapper.
        model = unwrap(self.state.model)
        model.eval()
        metrics_fn = self.workload.metrics or flat_accuracy
        sums = self._zeros(2)
        metric_sums = None
        shards = val_batches(
            self.workload.val_dataset, rank=ctx.rank, world_size=ctx.world_size, batch_size=self.spec.batch.per_worker
        )
        for (x, y), counted in shards:
            x, y = x.to(ctx.device, non_blocking=True), y.to(ctx.device, non_blocking=True)
            with autocast(self.spec.precision, ctx.device):
                out = model(x)  # always run: on FSDP every rank joins the same forwards
            if counted == 0 and self.metric_names is not None:
                continue
            # A shard that is all padding still learns the names (weight 0): every rank sums the same list.
            out, y = out[: max(counted, 1)], y[: max(counted, 1)]
            targets = y.numel() if counted else 0
            values = metrics_fn(out, y)
            if self.metric_names is None:
                self.metric_names = metric_names(values)
            batch_sums = weighted_sums(values, self.metric_names, targets, ctx.device)
            metric_sums = batch_sums if metric_sums is None else metric_sums + batch_sums
            if targets:
                loss = self.workload.loss_fn(out, y).double() * targets
                sums += torch.stack([loss, torch.tensor(targets, dtype=torch.float64, device=ctx.device)])
        if metric_sums is None:  # no validation batch at all: no names on any rank either
            metric_sums = self._zeros(len(self.metric_names or []))
        return torch.cat([sums, metric_sums])

    # --- checkpoints --------------------------------------------------------------------------------

    def _timed_checkpoint(self, metrics: dict[str, Any], committed: bool = False) -> None:
        """``_checkpoint``, its seconds added to the ones the next metric point reports (goodput's checkpoint
        blocking: the same on every rank, as every rank's checkpoint ends at the same barrier)."""
        with self.blocking.timed():
            self._checkpoint(metrics, committed)

    def _checkpoint(self, metrics: dict[str, Any], committed: bool = False) -> None:
        # Every rank writes its part into its own folder and reports it (Ray Train's report is a barrier).
        # Asynchronous (checkpoint.async): the loop waits only for a snapshot of the state on the CPU; the writer's
        # thread writes and reports it. FSDP's state dict and gathered model.pt are collectives on the training
        # group, so they are taken here; the snapshot copies this rank's shards and the thread saves them with DCP
        # on its own gloo group. The run's last checkpoint and one it must wait for (a preemption's,
        # wait_for_commit) are synchronous, after the one in flight; so are the writes of sweep trials
        # (background_checkpoints off), whose upload alone is asynchronous.
        final = self.position.epoch >= self.spec.epochs and self.position.epoch_steps >= self.batches.steps_per_epoch
        wait = committed or self.spec.checkpoint.wait_for_commit
        asynchronous = self.spec.checkpoint.async_ and not (wait or final)
        reported = {**metrics, "epoch": self.position.epoch, "step": self.position.step}
        if asynchronous and self.background_checkpoints:
            files, sharded = checkpoint_state(
                rank=self.ctx.rank,
                strategy=self.plan.strategy,
                state=self.state,
                position=self.position,
                epoch_loss=self.epoch_loss,
            )
            self.writer.submit(files, reported, sharded)
            return
        self.writer.wait()
        folder = tempfile.mkdtemp(prefix="checkpoint-")
        try:
            save_checkpoint(
                folder,
                rank=self.ctx.rank,
                world_size=self.ctx.world_size,
                strategy=self.plan.strategy,
                state=self.state,
                position=self.position,
                epoch_loss=self.epoch_loss,
            )
            self.ctx.report(reported, folder, asynchronous=asynchronous)
            if wait:
                self.ctx.wait_committed(reported)
        finally:
            if not asynchronous:
                shutil.rmtree(folder, ignore_errors=True)

    def _zeros(self, size: int) -> torch.Tensor:
        # Sums stay on the device: no host sync per step.
        return torch.zeros(size, dtype=torch.float64, device=self.ctx.device)
