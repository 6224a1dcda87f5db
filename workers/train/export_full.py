"""Make an FSDP checkpoint saved with only its shards servable: write its full ``model.pt``.

    python -m workers.train.export_full <checkpoint folder or storage URI> [...]

Every FSDP checkpoint saved since the fix of finding 5 (docs/security.md) carries ``model.pt``, gathered by the training run
itself; older ones hold only ``sharded/`` (DCP) and a Serve replica refuses them, since it loads only
``model.pt``, with ``weights_only=True``. This one-off command, run by an operator, reads the model's tensors
from the shards without unpickling anything (``workers.runtime.dcp_reader``), writes them as ``model.pt`` and
lists that file in rank 0's manifest. A checkpoint with manifests is verified first (sizes and SHA-256): a
cut-short one is refused. The optimizer's shards are left as they are; resuming training does not use
``model.pt``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
from pathlib import Path

import pyarrow.fs
import torch

from orchestrator_contract.checkpoints import MODEL_FILE, SHARDED_DIR
from workers.runtime.dcp_reader import read_full_model
from workers.runtime.manifest import MANIFEST_DIR, add_to_manifest, manifest_name, resolve, verify_checkpoint

log = logging.getLogger(__name__)


def export_full_model(location: str) -> str:
    """Write ``model.pt`` into the checkpoint at ``location`` (a local folder or a storage URI) from its
    shards; returns what was done, in words. ValueError, saying why, when it can't."""
    fs, path = resolve(location)
    path = path.rstrip("/")
    if isinstance(fs, pyarrow.fs.LocalFileSystem):
        return _export_local(Path(path), location)
    with tempfile.TemporaryDirectory(prefix="export-full-") as scratch:
        local = Path(scratch) / "checkpoint"
        pyarrow.fs.copy_files(
            path, str(local), source_filesystem=fs, destination_filesystem=pyarrow.fs.LocalFileSystem()
        )
        done = _export_local(local, location)
        for relative in (MODEL_FILE, f"{MANIFEST_DIR}/{manifest_name(0)}"):
            if (local / relative).is_file():
                with open(local / relative, "rb") as source, fs.open_output_stream(f"{path}/{relative}") as target:
                    target.write(source.read())
        return done


def _export_local(folder: Path, shown: str) -> str:
    if not folder.is_dir():
        raise ValueError(f"{shown} is not a checkpoint folder")
    if (folder / MODEL_FILE).is_file():
        return f"{shown} already holds {MODEL_FILE}: nothing to do"
    if not (folder / SHARDED_DIR).is_dir():
        raise ValueError(f"{shown} holds neither {MODEL_FILE} nor {SHARDED_DIR}/: not a checkpoint of a model")
    has_manifests = (folder / MANIFEST_DIR).is_dir()
    if has_manifests:
        verification = verify_checkpoint(folder)
        if not verification:
            raise ValueError(f"{shown} is not a whole checkpoint: {verification.problem}")
    else:
        log.warning("%s has no manifests (saved before they existed): its files cannot be verified", shown)
    state = read_full_model(folder / SHARDED_DIR)
    partial = folder / f".{MODEL_FILE}.partial"
    torch.save(state, partial)
    os.replace(partial, folder / MODEL_FILE)  # whole or not at all
    if has_manifests:
        add_to_manifest(folder, MODEL_FILE, rank=0)
    size = (folder / MODEL_FILE).stat().st_size
    return f"wrote {shown}/{MODEL_FILE}: {len(state)} tensors, {size} bytes"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m workers.train.export_full",
        description=f"Write {MODEL_FILE} (the full model, tensors only) for FSDP checkpoints that hold only their "
        "shards, so that they can be served.",
    )
    parser.add_argument("checkpoints", nargs="+", help="checkpoint folders or storage URIs (s3://...)")
    args = parser.parse_args(argv)
    failed = 0
    for checkpoint in args.checkpoints:
        try:
            print(export_full_model(checkpoint))
        except (ValueError, OSError) as exc:
            print(f"{checkpoint}: {exc}", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    sys.exit(main())
