"""The GPU path through the service: a 1-GPU job on the session's cluster, which takes the machine's GPUs
(tests/integration/conftest.py). Marked ``gpu``: skipped, saying why, where there is none; run by
``scripts/gpu-check.sh`` on a GPU machine."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.integration, pytest.mark.gpu]


def saved_on(path: Path) -> set[str]:
    """Where the tensors of a saved state dict were when it was saved ("cpu", "cuda:0", ...)."""
    locations: set[str] = set()

    def note(storage, location):
        locations.add(location)
        return storage  # kept on the CPU

    torch.load(path, weights_only=True, map_location=note)
    return locations


def test_a_one_gpu_fp16_job_trains_on_its_gpu(member):
    """Ray gives the worker its GPU, Ray Train a 1-rank NCCL group, the loop fp16 with its grad scaler."""
    response = member.submit(name="digits-gpu", scaling={"num_workers": 1, "use_gpu": True}, precision="fp16")
    assert response.status_code == 201, response.text
    job = member.wait(response.json()["id"], {"SUCCEEDED"}, timeout_s=300)
    assert job["result"]["metrics"]["val_accuracy"] >= 0.9, job["result"]

    checkpoint = Path(member.http.get(f"/v1/jobs/{job['id']}/checkpoints").json()[-1]["path"])
    assert saved_on(checkpoint / "model.pt") == {"cuda:0"}  # the model trained on the GPU Ray gave it
    rank = torch.load(checkpoint / "ranks" / "rank-00000.pt", weights_only=True, map_location="cpu")
    assert len(rank["rng"]["cuda"]) == 1  # the worker sees its one GPU, and its generator state was saved
    train_state = torch.load(checkpoint / "train_state.pt", weights_only=True, map_location="cpu")
    assert train_state["scaler"]["scale"] > 0  # fp16's grad scaler, saved for an exact resume
