"""Keeping Ray Train's run snapshot in line with the checkpoints that are still in storage.

Ray Train records every checkpoint it registers in ``<storage>/<run>/checkpoint_manager_snapshot.json``
and, when a new ``TorchTrainer`` of the same run starts (the next attempt of a job), refuses to start
if the snapshot names a checkpoint folder that no longer exists ("The run snapshot contains a reference
to a checkpoint that does not exist anymore"). Ray Train keeps every checkpoint here
(``num_to_keep=None``): the control plane's retention and orphan sweeper delete them. So before each
attempt, the names of deleted folders are taken out of the snapshot; if the latest one is gone, the
newest remaining becomes the latest (the resume logic then verifies it, see ``workers.runtime.manifest``).

The snapshot is Ray's own format (checked against Ray 2.60, which refuses snapshots of other versions
anyway); anything unexpected in it is left alone with a warning.
"""

from __future__ import annotations

import json
import logging

import pyarrow.fs

from workers.runtime.manifest import resolve

log = logging.getLogger(__name__)

SNAPSHOT_FILE = "checkpoint_manager_snapshot.json"
_VALIDATION_STATUS_LISTS = (
    "validated_checkpoint_dir_names",
    "timed_out_validation_checkpoint_dir_names",
    "failed_validation_checkpoint_dir_names",
)


def forget_deleted_checkpoints(storage_path: str, run_name: str) -> list[str]:
    """Drop the checkpoints whose folders are gone from the run's snapshot; returns their names."""
    fs, root = resolve(storage_path)
    run_dir = f"{root.rstrip('/')}/{run_name}"
    snapshot_path = f"{run_dir}/{SNAPSHOT_FILE}"
    if fs.get_file_info(snapshot_path).type != pyarrow.fs.FileType.File:
        return []
    with fs.open_input_stream(snapshot_path) as stream:
        raw = stream.read()
    try:
        state = json.loads(raw)
        updated, forgotten = _without_missing(state, _existing_folders(fs, run_dir))
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        log.warning("left %s as it is: not the snapshot format this code knows (%s)", snapshot_path, exc)
        return []
    if forgotten:
        with fs.open_output_stream(snapshot_path) as stream:
            stream.write(json.dumps(updated).encode())
        log.info("forgot %d deleted checkpoint(s) in %s: %s", len(forgotten), snapshot_path, ", ".join(forgotten))
    return forgotten


def _existing_folders(fs: pyarrow.fs.FileSystem, run_dir: str) -> set[str]:
    entries = fs.get_file_info(pyarrow.fs.FileSelector(run_dir, allow_not_found=True))
    return {e.base_name for e in entries if e.type == pyarrow.fs.FileType.Directory}


def _without_missing(state: dict, existing: set[str]) -> tuple[dict, list[str]]:
    results = state["checkpoint_results"]
    indices = state["checkpoint_report_indices"]
    if len(results) != len(indices):
        raise ValueError("checkpoint_results and checkpoint_report_indices differ in length")
    forgotten = [r["checkpoint_dir_name"] for r in results if r["checkpoint_dir_name"] not in existing]
    if not forgotten:
        return state, []
    kept = [(r, i) for r, i in zip(results, indices, strict=False) if r["checkpoint_dir_name"] in existing]
    updated = dict(state)
    updated["checkpoint_results"] = [r for r, _ in kept]
    updated["checkpoint_report_indices"] = [i for _, i in kept]
    latest = state.get("latest_checkpoint_result")
    if latest is not None and latest["checkpoint_dir_name"] not in existing:
        # The newest remaining one by report order, or none: a fresh start.
        updated["latest_checkpoint_result"] = max(kept, key=lambda pair: pair[1])[0] if kept else None
    pending = list(
        zip(state.get("pending_training_results", []), state.get("pending_validation_specs", []), strict=False)
    )
    pending = [(r, spec) for r, spec in pending if r["checkpoint_dir_name"] in existing]
    if "pending_training_results" in state:
        updated["pending_training_results"] = [r for r, _ in pending]
        updated["pending_validation_specs"] = [spec for _, spec in pending]
    for key in _VALIDATION_STATUS_LISTS:
        if key in state:
            updated[key] = [name for name in state[key] if name in existing]
    return updated, forgotten
