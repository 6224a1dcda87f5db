"""A sweep's preemption inside Ray Tune (docs/scheduling.md; the control plane's side: ``orchestrator.services.preemption``).

The whole sweep is preempted, through Tune's own interrupt-and-restore path:

1. Each running trial's rank 0 polls the sweep's control endpoint (``sweep_control`` in its Train config,
   ``workers.runtime.control``); told ``checkpoint_now``, its loop writes a checkpoint at the next step,
   outside the schedule, and its Train run returns ``{PREEMPTED_KEY: step}`` as a job's does. A checkpoint
   taken mid-epoch is not a Tune result (it has no metrics: ``is_epoch_result``); one taken at an epoch's end is
   that epoch's result, as always.
2. The trial must not return to Tune (Tune would record it finished and never run it again): ``pause_trial``
   leaves a marker, ``<sweep>/preempted/attempt-<n>/<trial id>.json`` (the checkpoint's step, and that of the
   last result it handed to Tune), and waits to be stopped.
3. The driver polls the same endpoint (``SweepPreemption``). Once every trial Tune runs has left its marker
   and Tune holds that trial's last result, ``PreemptionWatch`` interrupts Tune as Ctrl-C does: Tune saves its
   experiment state with those trials unfinished, stops their actors and returns; the driver exits
   ``DriverExit.PREEMPTED``. The control plane requeues the sweep; its next attempt restores the experiment
   (``Tuner.restore(resume_unfinished=True)``), and each paused trial's Train run, under the same name, resumes
   from its preemption checkpoint. Finished trials are kept and never run again.

A PBT trial pauses the same way, but a restored PBT trial starts a new Train run from its latest Tune
checkpoint (``tuner.run_pbt_trial``): it repeats the steps since its last epoch, not at most one. A trial Tune
starts after the preemption (its searcher does not know) pauses at its first step. One that never
pauses (its workers cannot start) keeps the driver from interrupting Tune: the control plane stops the sweep
after ``preemption_grace_s`` and its trials resume from their last epoch checkpoints.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any

import pyarrow.fs
from ray import tune

from orchestrator_contract.metrics import POSITION_KEYS
from workers.runtime.control import ControlPoller
from workers.runtime.manifest import resolve

log = logging.getLogger(__name__)

MARKERS_FOLDER = "preempted"  # <storage>/<sweep>/preempted/attempt-<n>/<trial id>.json
CHECK_EVERY_S = 0.5  # the driver looks for markers at most this often (Tune's loop steps far more often)


def markers_folder(sweep_folder: str, attempt: int) -> str:
    return f"{sweep_folder.rstrip('/')}/{MARKERS_FOLDER}/attempt-{attempt}"


@dataclass(frozen=True)
class SweepControl:
    """How a sweep's driver and trials hear of its preemption: the sweep's control endpoint and run token (a
    trial's ``sweep_control``, ``workers.runtime.control.control_target``), and where paused trials say so."""

    url: str
    sweep_id: str
    attempt: int
    token: str
    markers: str

    def as_config(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "sweep_id": self.sweep_id,
            "attempt": self.attempt,
            "token": self.token,
            "markers": self.markers,
        }


def is_epoch_result(metrics: dict[str, Any]) -> bool:
    """A Train report that is a Tune result: an epoch's checkpoint, with its metrics. A preemption checkpoint
    taken mid-epoch carries only its position (epoch, step) and is none."""
    return not set(metrics) <= POSITION_KEYS


def pause_trial(control: dict[str, Any], trial_id: str, last_metrics: dict[str, Any]) -> None:
    """In a trial whose Train run stopped for the sweep's preemption: say so (the marker) and wait for the driver
    to interrupt Tune, which stops this actor. Never returns: returning would finish the trial in Tune's books."""
    tune_step = int(last_metrics["step"]) if is_epoch_result(last_metrics) and "step" in last_metrics else None
    fs, folder = resolve(control["markers"])
    fs.create_dir(folder, recursive=True)
    with fs.open_output_stream(f"{folder}/{trial_id}.json") as out:
        out.write(json.dumps({"trial": trial_id, "step": last_metrics.get("step"), "tune_step": tune_step}).encode())
    log.info(
        "trial %s: checkpointed at step %s for the sweep's preemption; paused until the driver stops Tune",
        trial_id,
        last_metrics.get("step"),
    )
    threading.Event().wait()


def read_markers(markers: str) -> dict[str, int | None]:
    """Paused trials of this attempt: trial id -> the step of the last result each handed to Tune (None: a
    checkpoint mid-epoch, no new result)."""
    fs, folder = resolve(markers)
    paused: dict[str, int | None] = {}
    for entry in fs.get_file_info(pyarrow.fs.FileSelector(folder, allow_not_found=True)):
        if entry.type != pyarrow.fs.FileType.File or not entry.base_name.endswith(".json"):
            continue
        with fs.open_input_stream(entry.path) as stream:
            marker = json.loads(stream.read())
        paused[marker["trial"]] = marker.get("tune_step")
    return paused


def all_paused(trials, paused: dict[str, int | None]) -> bool:
    """Every trial Tune runs has paused, and Tune has the last result each handed it."""
    for trial in trials:
        if trial.status != "RUNNING":
            continue
        if trial.trial_id not in paused:
            return False
        tune_step = paused[trial.trial_id]
        if tune_step is not None and int((trial.last_result or {}).get("step", -1)) < tune_step:
            return False
    return True


class SweepPreemption:
    """The driver's side: polls the sweep's control endpoint; ``interrupted`` once ``PreemptionWatch`` stopped
    Tune for it."""

    def __init__(self, control: SweepControl) -> None:
        self.control = control
        self.poller = ControlPoller(control.url, control.sweep_id, control.attempt, control.token, collection="sweeps")
        self.interrupted = False
        self.asked_at: float | None = None
        self.checked_at = 0.0  # time.monotonic() of the last look for markers

    def close(self) -> None:
        self.poller.close()


# The driver's SweepPreemption, by sweep id: Tune pickles its callbacks into the experiment state (and
# Tuner.restore unpickles them), and a poller's thread can't be pickled (as tuner.REPORTERS).
PREEMPTIONS: dict[str, SweepPreemption] = {}


class PreemptionWatch(tune.Callback):
    """Runs in the driver's Tune loop: once the sweep is preempted and every running trial has paused,
    interrupts Tune the way Ctrl-C does (SIGUSR1, which Tune handles in this, its main, thread): Tune saves
    the experiment state with those trials unfinished and returns."""

    def __init__(self, sweep_id: str) -> None:
        self.sweep_id = sweep_id

    def on_step_end(self, iteration, trials, **info) -> None:
        preemption = PREEMPTIONS.get(self.sweep_id)
        if preemption is None or preemption.interrupted or not preemption.poller.checkpoint_now:
            return
        now = time.monotonic()
        if preemption.asked_at is None:
            preemption.asked_at = now
            log.info("sweep %s preempted: waiting for its running trials to checkpoint and pause", self.sweep_id)
        if now - preemption.checked_at < CHECK_EVERY_S:
            return
        preemption.checked_at = now
        if not all_paused(trials, read_markers(preemption.control.markers)):
            return
        running = sum(1 for t in trials if t.status == "RUNNING")
        log.info(
            "sweep %s: %d running trial(s) paused %.1f s after the preemption; stopping Tune (its state is saved)",
            self.sweep_id,
            running,
            now - preemption.asked_at,
        )
        preemption.interrupted = True
        os.kill(os.getpid(), signal.SIGUSR1)
