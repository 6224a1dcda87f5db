"""``--follow``: a job's log lines as they come, its state changes as lines, and on a terminal a live
progress line (epoch x of N, step, the latest losses/accuracy or the job's own metrics, samples/s); a
sweep's live trial table. Ends with the exit code of the job's (or sweep's) result (``exits``).

The log stream is read in a thread (the server ends it when the job ends); the main thread polls the job
every ``POLL_S`` for its state, events and metrics, prints what the thread read, and is the one Ctrl-C
reaches: it stops following and cancels nothing unless asked to (``cancel_on_interrupt``)."""

from __future__ import annotations

import contextlib
import queue
import sys
import threading
import time
from typing import Any

from rich.live import Live
from rich.text import Text

from orchestrator_client.cli import exits, output

POLL_S = 2.0
# After the job ended: how long its log stream may take to end (the server sends the driver's last lines
# once its process has exited) before the follow stops waiting for it.
LOG_GRACE_S = 20.0
TERMINAL = frozenset({"SUCCEEDED", "FAILED", "CANCELLED"})
# Shown first when a job reports them; the rest of its own metrics come after, up to _MAX_SHOWN in all.
_PREFERRED = ("train_loss", "val_loss", "val_accuracy")
POSITION = frozenset({"epoch", "step"})
_NOT_SHOWN = POSITION | {"samples_per_s", "lr"}
_MAX_SHOWN = 4


class Screen:
    """Where a follow prints: log lines as they are, orch's own lines marked ``==>``, and (on a terminal)
    one live line or table under them that is redrawn in place. Off a terminal there is no live display."""

    def __init__(self) -> None:
        self.tty = output.is_terminal()
        self.console = output.console()
        self.live = Live(console=self.console, transient=True, refresh_per_second=4) if self.tty else None

    def __enter__(self) -> Screen:
        if self.live is not None:
            self.live.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.live is not None:
            self.live.stop()

    def line(self, text: str) -> None:
        if self.live is not None:
            self.console.print(Text(text))
        else:
            sys.stdout.write(text + "\n")
            sys.stdout.flush()

    def note(self, text: str) -> None:
        if self.live is not None:
            self.console.print(Text(f"==> {text}", style="bold cyan"))
        else:
            self.line(f"==> {text}")

    def error(self, text: str) -> None:
        if self.live is not None:
            self.live.stop()
        sys.stdout.flush()
        output.console(stderr=True).print(Text(text, style="bold red" if sys.stderr.isatty() else ""))

    def show(self, renderable: Any) -> None:
        if self.live is not None:
            self.live.update(renderable)


class _LogReader(threading.Thread):
    """Reads ``job.logs(follow=True)`` into a queue until the stream ends (or breaks: the poll goes on)."""

    def __init__(self, job: Any) -> None:
        super().__init__(name=f"orch-logs-{job.id}", daemon=True)
        self.job = job
        self.lines: queue.Queue[str] = queue.Queue()
        self.broken: str | None = None

    def run(self) -> None:
        try:
            for line in self.job.logs(follow=True):
                self.lines.put(line)
        except Exception as error:  # the stream broke or the client closed: the poll still sees the end
            self.broken = str(error)


class JobFollow:
    def __init__(self, job: Any, timeout: float | None = None, cancel_on_interrupt: bool = False, logs: bool = True):
        self.job, self.timeout, self.cancel_on_interrupt = job, timeout, cancel_on_interrupt
        self.reader = _LogReader(job) if logs else None
        self.metrics: dict[str, Any] = {}  # every metric seen (a step's report has no val_accuracy)
        self.seen_events = 0
        self.waiting: tuple[str, str] | None = None
        self.shown_epoch: Any = None
        self.told_broken = False
        self.started = time.monotonic()
        self.screen = Screen()

    def run(self) -> int:
        try:
            with self.screen:
                return self._follow()
        except KeyboardInterrupt:
            return self._interrupted()

    def _follow(self) -> int:
        deadline = None if self.timeout is None else self.started + self.timeout
        if self.reader is not None:
            self.reader.start()
        while True:
            self.poll()
            if self.job.state in TERMINAL:
                self._print_logs(time.monotonic() + LOG_GRACE_S, until_stream_ends=True)
                return self._ended()
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                self._print_logs(now)
                return self._timed_out()
            self._print_logs(min(now + POLL_S, deadline if deadline is not None else float("inf")))

    def poll(self) -> None:
        """Read the job again: new state changes become lines, its metrics the progress line."""
        job = self.job.reload()
        self.job = job if job is not None else self.job
        events = list(self.job.events())
        for event in events[self.seen_events :]:
            self.screen.note(event_line(event))
        self.seen_events = len(events)
        state = str(self.job.state)
        if state == "QUEUED" and self.job.message and (self.job.reason, self.job.message) != self.waiting:
            self.waiting = (self.job.reason, self.job.message)
            self.screen.note(f"waiting ({self.job.reason}): {self.job.message}")
        self.metrics.update(self.job.latest_metrics or {})
        progress = progress_text(self.job, self.metrics, time.monotonic() - self.started)
        if self.screen.tty:
            self.screen.show(Text(progress, style="bold"))
        elif self.metrics.get("epoch") != self.shown_epoch and state not in TERMINAL:
            self.shown_epoch = self.metrics.get("epoch")
            self.screen.note(progress)

    def _print_logs(self, until: float, until_stream_ends: bool = False) -> None:
        """Print what the log thread read, waiting for more until ``until`` (or until the stream ended)."""
        if self.reader is None:
            time.sleep(max(0.0, until - time.monotonic()))
            return
        if self.reader.broken is not None and not self.told_broken:
            self.told_broken = True  # e.g. 429: the key follows as many logs as it may; the state still comes
            self.screen.note(f"the log stream ended ({self.reader.broken}); following the job's state only")
        while True:
            remaining = until - time.monotonic()
            try:
                line = self.reader.lines.get(timeout=max(0.0, min(remaining, 0.2)))
            except queue.Empty:
                if remaining <= 0 or (until_stream_ends and not self.reader.is_alive() and self.reader.lines.empty()):
                    return
                continue
            self.screen.line(line)

    def _ended(self) -> int:
        job, state = self.job, str(self.job.state)
        if state == "SUCCEEDED":
            self.screen.note(f"job {job.id} SUCCEEDED {output.metrics_text(final_metrics(job))}".rstrip())
        elif state == "CANCELLED":
            self.screen.note(f"job {job.id} CANCELLED ({job.reason}) {job.message}".rstrip())
        else:
            self.screen.error(f"job {job.id} {state} ({job.reason}): {job.message}")
        return exits.for_state(state)

    def _timed_out(self) -> int:
        self.screen.error(
            f"timed out after {self.timeout:g} s: job {self.job.id} is {self.job.state} and goes on "
            f"(orch jobs follow {self.job.id}; orch jobs cancel {self.job.id})"
        )
        return exits.TIMEOUT

    def _interrupted(self) -> int:
        job = self.job
        if self.cancel_on_interrupt:
            job = job.cancel()
            output.note(f"interrupted: cancelling job {job.id} (now {job.state})")
        else:
            output.note(
                f"interrupted: stopped following; job {job.id} goes on "
                f"(orch jobs follow {job.id}; orch jobs cancel {job.id})"
            )
        return exits.INTERRUPTED


def follow_job(job: Any, timeout: float | None = None, cancel_on_interrupt: bool = False) -> int:
    return JobFollow(job, timeout, cancel_on_interrupt).run()


def final_metrics(job: Any) -> dict[str, Any]:
    """The metrics the job ended with, the usual ones first; its position (epoch, step) left out."""
    final = (job.result or {}).get("metrics") or {}
    names = [n for n in _PREFERRED if n in final] + [n for n in final if n not in _PREFERRED and n not in POSITION]
    return {name: final[name] for name in names}


def event_line(event: Any) -> str:
    """A state change as one line: ``RUNNING -> RESTARTING (worker_died): the message's first line``."""
    first = (event.message or "").strip().splitlines()[0][:300] if (event.message or "").strip() else ""
    change = f"{event.from_state} -> {event.to_state}" if event.from_state else f"{event.to_state}"
    reason = f" ({event.reason})" if event.reason else ""
    return f"{change}{reason}{': ' + first if first else ''}"


def progress_text(job: Any, metrics: dict[str, Any], elapsed_s: float) -> str:
    """``RUNNING | epoch 3/12 | step 230 | train_loss 0.4123 | val_accuracy 0.9312 | 812 samples/s | 1m05s``."""
    parts = [str(job.state)]
    epochs = (job.spec or {}).get("epochs")
    if "epoch" in metrics:
        parts.append(f"epoch {metrics['epoch']}/{epochs}" if epochs else f"epoch {metrics['epoch']}")
    if "step" in metrics:
        parts.append(f"step {metrics['step']}")
    names = [n for n in _PREFERRED if n in metrics]
    names += sorted(n for n in metrics if n not in _NOT_SHOWN and n not in names)
    for name in names[:_MAX_SHOWN]:
        value = metrics[name]
        parts.append(f"{name} {value:.4g}" if isinstance(value, float) else f"{name} {value}")
    if isinstance(metrics.get("samples_per_s"), int | float):
        parts.append(f"{metrics['samples_per_s']:.0f} samples/s")
    minutes, seconds = divmod(int(elapsed_s), 60)
    parts.append(f"{minutes}m{seconds:02d}s")
    return " | ".join(parts)


class SweepFollow:
    """A sweep's live trial table (on a terminal), its trials' state changes as lines (off one), the final
    table and best trial at the end."""

    def __init__(self, sweep: Any, timeout: float | None = None, cancel_on_interrupt: bool = False):
        self.sweep, self.timeout, self.cancel_on_interrupt = sweep, timeout, cancel_on_interrupt
        self.trials: list[Any] = []
        self.trial_states: dict[str, str] = {}
        self.seen_events = 0
        self.screen = Screen()

    def run(self) -> int:
        from orchestrator_client.cli.trials import trials_table

        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        try:
            with self.screen:
                while True:
                    self.poll()
                    if str(self.sweep.state) in TERMINAL:
                        break
                    if deadline is not None and time.monotonic() >= deadline:
                        self.screen.error(
                            f"timed out after {self.timeout:g} s: sweep {self.sweep.id} is {self.sweep.state} and "
                            f"goes on (orch sweeps cancel {self.sweep.id})"
                        )
                        return exits.TIMEOUT
                    time.sleep(POLL_S if deadline is None else max(0.0, min(POLL_S, deadline - time.monotonic())))
        except KeyboardInterrupt:
            if self.cancel_on_interrupt:
                self.sweep = self.sweep.cancel()
                output.note(f"interrupted: cancelling sweep {self.sweep.id} (now {self.sweep.state})")
            else:
                output.note(f"interrupted: stopped following; sweep {self.sweep.id} goes on")
            return exits.INTERRUPTED
        output.console().print(trials_table(self.sweep, self.trials))
        return self._ended()

    def poll(self) -> None:
        sweep = self.sweep.reload()
        self.sweep = sweep if sweep is not None else self.sweep
        self.trials = list(self.sweep.list_trials())
        events = list(self.sweep.events())
        for event in events[self.seen_events :]:
            self.screen.note(f"sweep {event_line(event)}")
        self.seen_events = len(events)
        if self.screen.tty:
            from orchestrator_client.cli.trials import trials_table

            self.screen.show(trials_table(self.sweep, self.trials))
            return
        for trial in self.trials:
            state = str(trial.state)
            if self.trial_states.get(trial.id) != state:
                self.trial_states[trial.id] = state
                best = "" if trial.best_metric is None else f" best {self.sweep.metric} {trial.best_metric:.4g}"
                early = " (stopped early)" if trial.stopped_early else ""
                self.screen.note(f"trial {trial.number} {state}{early}{best} {output.cell(trial.config)}")

    def _ended(self) -> int:
        sweep, state = self.sweep, str(self.sweep.state)
        best = sweep.best_trial
        if state == "SUCCEEDED":
            text = f"sweep {sweep.id} SUCCEEDED"
            if best is not None:
                text += f": best trial {best.id} {sweep.metric}={best.metric:.4g} {output.cell(best.config)}"
            output.console().print(Text(f"==> {text}"))
        elif state == "CANCELLED":
            output.console().print(Text(f"==> sweep {sweep.id} CANCELLED ({sweep.reason}) {sweep.message}"))
        else:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
            output.console(stderr=True).print(Text(f"sweep {sweep.id} {state} ({sweep.reason}): {sweep.message}"))
        return exits.for_state(state)
