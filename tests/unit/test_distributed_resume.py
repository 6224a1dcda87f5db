"""Exact resume on 2 gloo ranks: 4 epochs straight == resumed from an epoch or a mid-epoch checkpoint.

Dropout, SGD momentum or AdamW state, LR warmup, clipping and accumulation are all on, so every part
of the checkpoint (model, optimizer, scheduler, position, sampler order, each rank's RNG) has to
come back for the parameters to match.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from tests.unit.harness import (
    MLP,
    TRANSFORMER,
    assert_same_state,
    job_config,
    model_state,
    run_on_ranks,
    train,
)
from workers.runtime.manifest import write_manifest
from workers.train.checkpoints import load_model_from_checkpoint

EPOCH_END = "checkpoint_000000008"  # after epoch 2 of 4 steps each
MID_EPOCH = "checkpoint_000000006"  # epoch 2, 2 of its 4 steps done

COMMON = {"epochs": 4, "grad_clip_norm": 1.0, "checkpoint": {"every_epochs": 1, "every_steps": 3, "export_full": True}}
SCENARIOS = {
    "ddp": job_config(
        MLP,
        strategy="ddp",
        config={"dropout": 0.3},
        batch={"per_worker": 4, "accumulation_steps": 2},
        lr={"base": 0.2, "warmup_steps": 3},
        **COMMON,
    ),
    "fsdp": job_config(
        TRANSFORMER,
        strategy="fsdp",
        config={"dropout": 0.2},
        batch={"per_worker": 8},
        optimizer={"name": "adamw", "weight_decay": 0.01},
        lr={"base": 0.02, "warmup_steps": 3},
        **COMMON,
    ),
}
SCENARIOS["ddp-bf16"] = {**SCENARIOS["ddp"], "spec": {**SCENARIOS["ddp"]["spec"], "precision": "bf16"}}
SCENARIOS["fsdp-bf16"] = {**SCENARIOS["fsdp"], "spec": {**SCENARIOS["fsdp"]["spec"], "precision": "bf16"}}
BF16_CLASSIFIER = job_config(
    MLP,
    precision="bf16",
    epochs=8,
    config={"samples": 512, "val_samples": 200},
    batch={"per_worker": 16},
    lr={"base": 0.2},
)


def resume_without_rank_state(config: dict, root: str, source: str) -> dict:
    """A resume from a copy of ``source`` without the ranks' RNG files (the control experiment)."""
    copy = Path(root) / "no-rank-state"
    if dist.get_rank() == 0:
        shutil.copytree(source, copy)
        shutil.rmtree(copy / "ranks")
        shutil.rmtree(copy / "manifests")  # new ones, else the copy is incomplete and never resumed from
        for rank in range(dist.get_world_size()):
            write_manifest(copy, rank=rank, world_size=dist.get_world_size())
    dist.barrier()
    return train(config, Path(root) / "run", copy)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    work = tmp_path_factory.mktemp("resume")
    tasks, names = [], []
    for name, config in SCENARIOS.items():
        straight = work / name / "straight"
        for label, root, resume_from in [
            ("straight", straight, None),
            ("from-epoch", work / name / "from-epoch", straight / EPOCH_END),
            ("from-mid-epoch", work / name / "from-mid-epoch", straight / MID_EPOCH),
        ]:
            tasks.append((train, {"config": config, "root": root, "resume_from": resume_from}))
            names.append((name, label))
    ddp_straight = work / "ddp" / "straight"
    control = {"config": SCENARIOS["ddp"], "root": work / "control", "source": ddp_straight / MID_EPOCH}
    tasks.append((resume_without_rank_state, control))
    names.append(("ddp", "without-rank-state"))
    tasks.append((train, {"config": BF16_CLASSIFIER, "root": work / "bf16-classifier"}))
    names.append(("bf16-classifier", "straight"))
    rank0 = run_on_ranks(tasks, work)[0]
    return dict(zip(names, rank0, strict=True))


def final_state(run: dict) -> dict[str, torch.Tensor]:
    return model_state(run["checkpoints"][-1])


@pytest.mark.parametrize("scenario", list(SCENARIOS))
@pytest.mark.parametrize("resumed", ["from-epoch", "from-mid-epoch"])
def test_resumed_run_ends_with_the_same_parameters(runs, scenario, resumed):
    straight, other = runs[(scenario, "straight")], runs[(scenario, resumed)]
    assert_same_state(final_state(other), final_state(straight), atol=1e-6)

    # The epochs it ran report the same metrics too (a mid-epoch resume kept the epoch's loss sums).
    def epoch_points(run):
        return {e["epoch"]: e["values"] for e in run["events"] if "val_loss" in e.get("values", {})}

    resumed_points = epoch_points(other)
    assert set(resumed_points) == ({3, 4} if resumed == "from-epoch" else {2, 3, 4})
    for epoch, values in resumed_points.items():
        assert values == pytest.approx(epoch_points(straight)[epoch], abs=1e-9)


def test_checkpoints_by_steps_and_epochs(runs):
    reported = [(r["epoch"], r["step"]) for r in runs[("ddp", "straight")]["reported"]]
    # every 3 steps mid-epoch, every epoch end (step 12 is both: one checkpoint, at the epoch's end)
    assert reported == [(1, 3), (1, 4), (2, 6), (2, 8), (3, 9), (3, 12), (4, 15), (4, 16)]
    assert [(r["epoch"], r["step"]) for r in runs[("ddp", "from-mid-epoch")]["reported"]] == reported[3:]


def test_without_the_ranks_rng_state_a_resume_is_not_exact(runs):
    """The control: dropout makes the RNG state matter, so the equality above is not a coincidence."""
    assert runs[("ddp", "without-rank-state")]["reported"][0]["step"] == 8  # it resumed, mid-epoch 2
    control = final_state(runs[("ddp", "without-rank-state")])
    straight = final_state(runs[("ddp", "straight")])
    assert any(not torch.allclose(control[key], straight[key], atol=1e-6) for key in straight)


def test_checkpoint_layout_loads_without_unpickling(runs):
    ddp = Path(runs[("ddp", "straight")]["checkpoints"][-1])
    fsdp = Path(runs[("fsdp", "straight")]["checkpoints"][-1])
    assert sorted(p.name for p in ddp.iterdir()) == ["manifests", "model.pt", "ranks", "train_state.pt"]
    assert sorted(p.name for p in fsdp.iterdir()) == ["manifests", "model.pt", "ranks", "sharded", "train_state.pt"]
    assert sorted(p.name for p in (fsdp / "sharded").iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    for checkpoint in (ddp, fsdp):
        assert sorted(p.name for p in (checkpoint / "ranks").iterdir()) == ["rank-00000.pt", "rank-00001.pt"]
        for path in [*checkpoint.glob("*.pt"), *(checkpoint / "ranks").glob("*.pt")]:
            torch.load(path, weights_only=True)
    train_state = torch.load(fsdp / "train_state.pt", weights_only=True)
    assert (train_state["strategy"], train_state["epoch"], train_state["step"]) == ("fsdp", 4, 16)
    assert "optimizer" not in train_state  # FSDP's is sharded, in sharded/


def test_fsdp_full_export_serves_and_sharded_only_explains(runs, tmp_path):
    checkpoint = Path(runs[("fsdp", "straight")]["checkpoints"][-1])
    config = SCENARIOS["fsdp"]["spec"]["config"]
    model = load_model_from_checkpoint(str(checkpoint), TRANSFORMER, config)
    assert_same_state(model.state_dict(), model_state(checkpoint), atol=0)
    assert not model.training

    sharded_only = tmp_path / "sharded-only"
    shutil.copytree(checkpoint, sharded_only)
    (sharded_only / "model.pt").unlink()
    with pytest.raises(ValueError, match="only FSDP shards.*export_full"):
        load_model_from_checkpoint(str(sharded_only), TRANSFORMER, config)


def test_bf16_classifier_learns(runs):
    assert runs[("bf16-classifier", "straight")]["metrics"]["val_accuracy"] >= 0.9
