"""The training runtime's options, end to end through the service on the local Ray cluster."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from workers.train.checkpoints import load_model_from_checkpoint

pytestmark = pytest.mark.integration


def _epoch_points(member, job_id: str) -> list[dict]:
    return [m for m in member.http.get(f"/v1/jobs/{job_id}/metrics").json() if "val_accuracy" in m["values"]]


def test_bf16_digits_reaches_95_percent(member):
    job_id = member.submit(name="digits-bf16", precision="bf16").json()["id"]
    job = member.wait(job_id, {"SUCCEEDED"}, timeout_s=300)
    assert job["result"]["metrics"]["val_accuracy"] >= 0.95, job["result"]
    assert job["plan"] == {"strategy": "ddp", "reason": "", "global_batch": 64, "lr": pytest.approx(0.05)}


def test_fsdp_tiny_gpt_with_step_checkpoints_and_a_full_export(member, tmp_path_factory):
    text = tmp_path_factory.mktemp("text") / "corpus.txt"
    text.write_text("".join(f"line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(600)))
    config = {"text_path": str(text), "context": 32, "layers": 2, "width": 64, "heads": 4}
    response = member.submit(
        workload="tiny_gpt",
        name="gpt-fsdp",
        config=config,
        strategy="fsdp",
        epochs=2,
        batch={"per_worker": 16, "accumulation_steps": 2},
        optimizer={"name": "adamw"},
        lr={"base": 3e-3, "base_batch": 64, "warmup_steps": 5},
        checkpoint={"every_epochs": None, "every_steps": 20, "keep": 2, "export_full": True},
    )
    assert response.status_code == 201, response.text
    job = member.wait(response.json()["id"], {"SUCCEEDED"}, timeout_s=300)
    assert job["plan"]["strategy"] == "fsdp" and job["plan"]["global_batch"] == 64

    points = _epoch_points(member, job["id"])
    assert [p["epoch"] for p in points] == [1, 2]
    assert points[-1]["values"]["val_loss"] < points[0]["values"]["val_loss"] < 5.55  # ln(256) is chance
    steps = member.http.get(f"/v1/jobs/{job['id']}/metrics").json()
    assert any(m["values"].get("tokens_per_s", 0) > 0 for m in steps)

    checkpoints = member.http.get(f"/v1/jobs/{job['id']}/checkpoints").json()
    assert len(checkpoints) == 2 and all(Path(c["path"]).is_dir() for c in checkpoints)
    model = load_model_from_checkpoint(checkpoints[-1]["path"], "tiny_gpt", job["spec"]["config"])
    assert sum(p.numel() for p in model.parameters()) > 0
    with torch.no_grad():
        assert model(torch.zeros(1, 32, dtype=torch.long)).shape == (1, 32, 256)


def test_custom_workload_from_an_allowed_package(member):
    response = member.submit(
        workload="example_workloads.spirals:build", config={"points": 1000}, epochs=30, lr={"base": 0.1}
    )
    assert response.status_code == 201, response.text
    job = member.wait(response.json()["id"], {"SUCCEEDED"}, timeout_s=300)
    assert job["result"]["metrics"]["val_accuracy"] > 0.75  # chance is 0.5; 30 epochs reach 0.85-0.88
    refused = member.submit(workload="os.path:join")
    assert refused.status_code == 422 and "not an allowed workload package" in refused.text
