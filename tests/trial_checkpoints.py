"""What a finished sweep's trials must say about their checkpoints, checked against storage itself
(integration and chaos tests): every checkpoint the database names exists and verifies, the trial's best
is the best kept epoch (ties: the later), storage holds exactly the recorded folders once the sweeper has
run, and each trial's last recorded epoch carries the metrics Ray Train itself recorded for it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pyarrow.fs

from workers.runtime.manifest import verify_checkpoint

SNAPSHOT_FILE = "checkpoint_manager_snapshot.json"


def trial_points(http: httpx.Client, trial_id: str) -> list[dict]:
    response = http.get(f"/v1/trials/{trial_id}/metrics")
    response.raise_for_status()
    return response.json()


def best_kept_epoch(points: list[dict], metric: str, mode: str) -> dict | None:
    """The rule (``orchestrator.checkpoint_policy``), restated: the best by ``metric`` among the epochs
    with a checkpoint, ties to the later epoch."""
    sign = 1 if mode == "max" else -1
    kept = [p for p in points if p.get("checkpoint_path") and metric in p["values"]]
    return max(kept, key=lambda p: (sign * p["values"][metric], p["epoch"]), default=None)


def stored_checkpoints(trials_dir: Path) -> set[str]:
    return {str(p) for p in trials_dir.glob("*/checkpoint_*") if p.is_dir()}


def assert_trial_checkpoints_agree(http: httpx.Client, sweep_id: str, trials_dir: Path, timeout_s: float = 30) -> None:
    sweep = http.get(f"/v1/sweeps/{sweep_id}").json()
    trials = http.get(f"/v1/sweeps/{sweep_id}/trials").json()
    problems: list[str] = []
    recorded: set[str] = set()
    for trial in trials:
        points = trial_points(http, trial["id"])
        paths = [p["checkpoint_path"] for p in points if p["checkpoint_path"]]
        recorded |= {str(Path(path)) for path in paths}
        for path in paths:
            if not Path(path).is_dir():
                problems.append(f"trial {trial['tune_id']} records {path}, which does not exist")
            elif not (verified := verify_checkpoint(path, pyarrow.fs.LocalFileSystem(), checksums=True)):
                problems.append(f"trial {trial['tune_id']}: {path} does not verify: {verified.problem}")
        best = best_kept_epoch(points, sweep["metric"], sweep["mode"])
        if best is not None and (trial["best_epoch"], trial["checkpoint_path"]) != (
            best["epoch"],
            best["checkpoint_path"],
        ):
            problems.append(
                f"trial {trial['tune_id']} names epoch {trial['best_epoch']} ({trial['checkpoint_path']}); "
                f"the best kept is {best['epoch']} ({best['checkpoint_path']})"
            )
        if trial["state"] == "SUCCEEDED":  # a stopped trial's run may have registered an epoch Tune never took
            problems += _last_epoch_matches_ray(trial, points)
    best_trial = sweep["best_trial"]
    if best_trial is not None and str(Path(best_trial["checkpoint_path"] or "-")) not in recorded:
        problems.append(f"the sweep's best trial names {best_trial['checkpoint_path']}, which no epoch records")

    deadline = time.monotonic() + timeout_s  # the sweeper deletes unrecorded folders a moment after the end
    while (stored := stored_checkpoints(trials_dir)) != recorded and time.monotonic() < deadline:
        time.sleep(0.5)
    if stored != recorded:
        problems.append(
            f"storage and database differ {timeout_s:.0f} s after the sweep ended: only in storage "
            f"{sorted(stored - recorded)}, only in the database {sorted(recorded - stored)}"
        )
    assert not problems, f"sweep {sweep_id}:\n- " + "\n- ".join(problems)


def _last_epoch_matches_ray(trial: dict, points: list[dict]) -> list[str]:
    """The trial's last recorded epoch has the metrics Ray Train recorded with its run's latest checkpoint
    (the run that epoch's checkpoint belongs to): nothing reported was lost or changed on the way."""
    last = max(points, key=lambda p: p["epoch"], default=None)
    if last is None or not last["checkpoint_path"]:
        return [] if last is None else [f"trial {trial['tune_id']}: its last epoch {last['epoch']} has no checkpoint"]
    snapshot = Path(last["checkpoint_path"]).parent / SNAPSHOT_FILE
    try:
        latest = json.loads(snapshot.read_text())["latest_checkpoint_result"]
    except (OSError, ValueError, KeyError) as exc:
        return [f"trial {trial['tune_id']}: cannot read {snapshot}: {exc}"]
    ray_metrics = latest["metrics"]
    if ray_metrics.get("epoch") != last["epoch"]:
        return [
            f"trial {trial['tune_id']}: Ray Train's latest is epoch {ray_metrics.get('epoch')}, the database's {last['epoch']}"
        ]
    differ = {k: (v, ray_metrics.get(k)) for k, v in last["values"].items() if ray_metrics.get(k) != v}
    return [f"trial {trial['tune_id']}: last epoch's metrics differ from Ray Train's: {differ}"] if differ else []
