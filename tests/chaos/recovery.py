"""What a recovery did, read back from the service and the cluster: where each restart resumed from,
which steps were run twice, which are missing. Shared by the chaos tests and ``bench/recovery.py``."""

from __future__ import annotations

import re
import threading
import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import httpx

from orchestrator.states.jobs import REQUESTS
from tests.chaos.harness import Api, ServiceProcess

# The digits job every scenario runs: 2 workers, 8 per worker (global batch 16, 89 steps per epoch),
# 2 epochs = 178 optimizer steps, a checkpoint every 10 steps (and at the end), a metric point per step.
# Kills land at step 105 at the latest, so a recovered run still has several checkpoint intervals to go.
CHECKPOINT_INTERVAL = 10
CHAOS_SPEC: dict = {
    "workload": "digits",
    "epochs": 2,
    "seed": 7,
    "scaling": {"num_workers": 2},
    "batch": {"per_worker": 8},
    # wait_for_commit: a failure repeats at most one checkpoint interval (without it, up to two: Ray Train
    # registers a checkpoint at the controller's next poll while the workers train on).
    "checkpoint": {"every_epochs": None, "every_steps": CHECKPOINT_INTERVAL, "keep": 2, "wait_for_commit": True},
    "metrics_every_steps": 1,
    "retries": {"max_worker_restarts": 2, "max_attempts": 3},
}

# Logged by every rank of a resumed worker group (workers/runtime/train_loop.py).
_RESUME_LINE = re.compile(r"resuming from (\S+) at epoch (\d+), step (\d+)")


def spec(name: str, **overrides) -> dict:
    return {**CHAOS_SPEC, "name": name, "labels": {"scenario": name}, **overrides}


def parse_time(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


@dataclass(frozen=True)
class Resume:
    path: str
    step: int


def resumes_in_log(log: str) -> list[Resume]:
    """Each worker-group start that loaded a checkpoint, in order (ranks log the same line: one kept)."""
    found: list[Resume] = []
    for match in _RESUME_LINE.finditer(log):
        resume = Resume(match.group(1), int(match.group(3)))
        if not found or found[-1] != resume:
            found.append(resume)
    return found


def steps_by_attempt(metrics: list[dict]) -> dict[int, list[int]]:
    by_attempt: dict[int, list[int]] = {}
    for point in metrics:
        by_attempt.setdefault(point["attempt"], []).append(point["step"])
    return {attempt: sorted(steps) for attempt, steps in sorted(by_attempt.items())}


def storage_checkpoints(svc: ServiceProcess, job_id: str) -> set[str]:
    run = svc.storage / job_id
    return {str(p) for p in run.glob("checkpoint_*") if p.is_dir()} if run.is_dir() else set()


def db_checkpoints(api: Api, job_id: str) -> set[str]:
    return {str(Path(c["path"])) for c in api.checkpoints(job_id)}


class CheckpointWatcher:
    """Every checkpoint the database listed while it ran (polled): what "committed" means to the control
    plane, even for checkpoints retention has dropped since. Survives the control plane being down."""

    def __init__(self, api: Api, job_id: str, interval_s: float = 0.2):
        self.api, self.job_id, self.interval_s = api, job_id, interval_s
        self.seen: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.seen |= db_checkpoints(self.api, self.job_id)
            except httpx.HTTPError:
                pass
            self._stop.wait(self.interval_s)

    def stop(self) -> set[str]:
        self._stop.set()
        self._thread.join(10)
        try:
            self.seen |= db_checkpoints(self.api, self.job_id)
        except httpx.HTTPError:
            pass
        return self.seen


@dataclass
class Kill:
    """One fault the test injected: what, when, in which attempt, and how far the job had got."""

    what: str  # "worker" (a worker group restart inside the attempt) or "driver" / "head" (a new attempt)
    at: float  # time.time() of the kill
    attempt: int
    step_before: int  # the furthest step reported when the kill landed (read just after it)


@dataclass
class Recovery:
    """The run's history after the fact."""

    job: dict
    steps: dict[int, list[int]]  # attempt -> steps reported
    resumes: dict[int, list[Resume]]  # attempt -> worker-group starts from a checkpoint, from its log
    resumed_from: list[Resume]  # per kill: where the run went on from
    repeated_steps: list[int]  # per kill: steps run again (reported before the kill, resumed before them)
    duplicate_points: int  # steps reported by more than one attempt
    missing_steps: list[int]
    restarting_at: list[float | None]  # per kill: time.time() of the RESTARTING event after it (noticed)
    resumed_at: list[float | None]  # per kill: time.time() of the RUNNING event after it
    first_new_step_at: list[float | None]  # per kill: time.time() of the first metric point made after that


def read_recovery(svc: ServiceProcess, api: Api, job_id: str, total_steps: int, kills: list[Kill]) -> Recovery:
    job = api.job(job_id)
    metrics = api.metrics(job_id)
    # Moves only: a request's row (a lost head's revoked drivers: RUNNING -> RUNNING) is no resume.
    events = [e for e in api.events(job_id) if e["reason"] not in REQUESTS]
    steps = steps_by_attempt(metrics)
    resumes: dict[int, list[Resume]] = {}
    for attempt in range(1, job["attempt"] + 1):
        try:
            log = svc.ray_jobs().get_job_logs(f"{job_id}-{attempt}")
        except Exception:  # an attempt on a head that is gone: its log went with it
            log = ""
        resumes[attempt] = resumes_in_log(log)

    resumed_from, repeated, restarting_at, resumed_at, first_new = [], [], [], [], []
    for kill in kills:
        # Inside an attempt a redone step merges into its point, so a worker kill's repeats are counted
        # from where the new group resumed; a new attempt's first point says where it resumed too.
        step_before = kill.step_before
        if kill.what == "worker":
            after = resumes.get(kill.attempt, [])
            resume = after[-1] if after else Resume("", 0)
        else:
            after = resumes.get(kill.attempt + 1, [])
            next_steps = steps.get(kill.attempt + 1, [])
            resume = after[0] if after else Resume("", (next_steps[0] - 1) if next_steps else 0)
            # The old attempt's workers may outlive its driver by a moment: count what they did too.
            step_before = max([step_before, *steps.get(kill.attempt, [])])
        resumed_from.append(resume)
        repeated.append(max(0, step_before - resume.step))
        restarting = [
            parse_time(e["created_at"])
            for e in events
            if e["to_state"] == "RESTARTING" and parse_time(e["created_at"]) > kill.at
        ]
        restarting_at.append(min(restarting) if restarting else None)
        running = [
            parse_time(e["created_at"])
            for e in events
            if e["to_state"] == "RUNNING" and parse_time(e["created_at"]) > kill.at
        ]
        resumed_at.append(min(running) if running else None)
        made = [parse_time(p["created_at"]) for p in metrics if running and parse_time(p["created_at"]) > min(running)]
        first_new.append(min(made) if made else None)

    counts = Counter(step for attempt_steps in steps.values() for step in attempt_steps)
    return Recovery(
        job=job,
        steps=steps,
        resumes=resumes,
        resumed_from=resumed_from,
        repeated_steps=repeated,
        duplicate_points=sum(n - 1 for n in counts.values()),
        missing_steps=sorted(set(range(1, total_steps + 1)) - set(counts)),
        restarting_at=restarting_at,
        resumed_at=resumed_at,
        first_new_step_at=first_new,
    )


def submissions_are_unique(svc: ServiceProcess, job_id: str, attempts: range) -> list[str]:
    """The cluster's Ray jobs for ``job_id``: each submission once, only ``<job_id>-<attempt>`` ids."""
    submitted = svc.submissions(job_id)
    duplicates = [sid for sid, n in Counter(submitted).items() if n > 1]
    assert not duplicates, f"submitted more than once: {duplicates}"
    expected = {f"{job_id}-{attempt}" for attempt in attempts}
    assert set(submitted) <= expected, f"unexpected submissions {sorted(set(submitted) - expected)}"
    return submitted


def wait_storage_matches_db(svc: ServiceProcess, api: Api, job_id: str, timeout_s: float = 15) -> set[str]:
    """Storage's checkpoint folders and the database's checkpoints become the same set (a sweeper may
    need a moment after the job ends)."""
    deadline = time.monotonic() + timeout_s
    while True:
        stored, listed = storage_checkpoints(svc, job_id), db_checkpoints(api, job_id)
        if stored == listed:
            return stored
        if time.monotonic() > deadline:
            raise AssertionError(
                f"storage and database checkpoints differ {timeout_s:.0f} s after the job ended:\n"
                f"  only in storage: {sorted(stored - listed)}\n  only in the database: {sorted(listed - stored)}"
            )
        time.sleep(0.5)


# Resume is exact (tests/unit/test_distributed_resume.py: identical parameters after a resume), so a
# recovered run trains on the same batches from the same state as the failure-free one and ends with
# the same weights: every recovery measured here matched the reference to the last digit. The
# tolerances leave room for floating-point noise only: one validation sample (1/360 = 0.0028) of
# accuracy, 1 % of the loss.
ACCURACY_TOLERANCE = 0.003
LOSS_TOLERANCE = 0.001


def assert_recovered(
    svc: ServiceProcess,
    api: Api,
    job_id: str,
    reference: dict,
    kills: list[Kill],
    committed: set[str],
    attempts: range,
    timeout_s: float = 300,
    resume_must_be_listed: bool = True,
    repeat_limit: int | None = CHECKPOINT_INTERVAL,
) -> Recovery:
    """What every scenario asserts once its faults are injected: the job succeeds with the metrics of a
    failure-free run, every step is reported, each recovery repeats at most one checkpoint interval and
    resumes from a committed checkpoint, the job and each Ray submission exist once, and storage holds
    exactly the checkpoints the database lists. Every broken invariant is listed, not only the first.
    ``repeat_limit``: the steps a recovery may repeat (one interval with ``wait_for_commit``); None: not bounded
    by steps (asynchronous checkpoints: a run trains on while Ray Train registers one, the scenario bounds it)."""
    job = api.wait(job_id, {"SUCCEEDED"}, timeout_s=timeout_s)
    rec = read_recovery(svc, api, job_id, reference["steps"], kills)
    problems: list[str] = []

    def check(ok: bool, problem: str) -> None:
        if not ok:
            problems.append(problem)

    check(job["attempt"] in attempts, f"ended on attempt {job['attempt']}, expected one of {list(attempts)}")
    final = job["result"]["metrics"]
    for key, tolerance in (("val_accuracy", ACCURACY_TOLERANCE), ("val_loss", LOSS_TOLERANCE)):
        check(
            abs(final[key] - reference["metrics"][key]) <= tolerance,
            f"{key} {final[key]:.5f} vs {reference['metrics'][key]:.5f} without failures (tolerance {tolerance})",
        )
    check(final["step"] == reference["steps"], f"ended at step {final['step']}, not {reference['steps']}")

    check(not rec.missing_steps, f"steps never reported: {rec.missing_steps}")
    for attempt, steps in rec.steps.items():
        check(steps == list(range(steps[0], steps[-1] + 1)), f"attempt {attempt} skipped steps: {steps}")
    for kill, resume, repeated in zip(kills, rec.resumed_from, rec.repeated_steps, strict=False):
        check(
            repeat_limit is None or repeated <= repeat_limit,
            f"{kill.what} kill at step {kill.step_before} resumed from step {resume.step}: {repeated} steps "
            f"repeated, more than {repeat_limit} (the checkpoint interval is {CHECKPOINT_INTERVAL})",
        )
        if kill.step_before > CHECKPOINT_INTERVAL:
            check(resume.step > 0, f"{kill.what} kill at step {kill.step_before}: restarted from scratch")
        # Where the Train controller itself goes down with the fault (a head or a node lost), the checkpoint
        # it registered last may reach the database in one batch with the next ones, and retention may drop
        # it in that same request: the watcher's polling cannot see it. The resume line is only logged for a
        # checkpoint whose manifests and checksums verified, so it is still a committed one.
        if resume.path and resume_must_be_listed:
            check(
                str(Path(resume.path)) in committed,
                f"resumed from {resume.path}, which the database never listed: {sorted(committed)}",
            )
    cross_attempt_limit = CHECKPOINT_INTERVAL * sum(k.what != "worker" for k in kills)
    check(
        rec.duplicate_points <= cross_attempt_limit,
        f"{rec.duplicate_points} steps reported by two attempts (at most {cross_attempt_limit})",
    )

    try:
        submitted = submissions_are_unique(svc, job_id, range(1, job["attempt"] + 1))
        check(f"{job_id}-{job['attempt']}" in submitted, f"no Ray submission of the last attempt: {submitted}")
    except AssertionError as exc:
        problems.append(str(exc))
    same_name = [j["id"] for j in api.jobs(label=f"scenario={job['spec']['name']}")]
    check(same_name == [job_id], f"jobs for one submission: {same_name}")
    try:
        wait_storage_matches_db(svc, api, job_id)
    except AssertionError as exc:
        problems.append(str(exc))

    summary = (
        f"job {job_id}: attempts {list(rec.steps)}, kills {[(k.what, k.step_before) for k in kills]}, "
        f"resumed from {[r.step for r in rec.resumed_from]}, repeated {rec.repeated_steps}"
    )
    assert not problems, summary + "\n- " + "\n- ".join(problems)
    return rec


def inject(api: Api, job_id: str, what: str, attempt: int, action) -> Kill:
    """Run ``action`` (the kill) and record it, with how far the job had got (read a second later, once
    what was on its way has arrived; a restart takes several seconds, so nothing is redone yet)."""
    action()
    at = time.time()
    time.sleep(1.0)
    try:
        step_before = api.max_step(job_id)
    except httpx.HTTPError:  # the kill took the control plane down: the points are in the drivers' buffers
        step_before = 0
    return Kill(what, at, attempt, step_before)


def events_of(api: Api, job_id: str) -> list[tuple[str, str, int]]:
    return [(e["to_state"], e["reason"], e["attempt"]) for e in api.events(job_id)]
