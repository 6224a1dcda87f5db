"""DDP on 2 ranks: the same updates as one worker with the whole batch, gradient accumulation
with one all-reduce per optimizer step, and synchronised BatchNorm. Each runs on 2 gloo ranks on the CPU
and, marked ``gpu(2)``, on 2 NCCL ranks on CUDA (torch's ``nn.SyncBatchNorm`` there); the single-layer
BatchNorm check runs on the CPU and on one GPU."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

from orchestrator_contract.jobs import JobSpec, TrainingPlan
from tests.unit.harness import (
    BN_MLP,
    DEVICE_OF,
    MLP,
    assert_same_state,
    backends,
    devices,
    job_config,
    loop_device,
    model_state,
    run_on_ranks,
    train,
)
from workers.runtime.data import TrainBatches
from workers.runtime.step import build_train_state, optimizer_step
from workers.runtime.sync_batchnorm import CpuSyncBatchNorm, convert_sync_batchnorm
from workers.workloads import load_workload

# Two epochs of 64 samples, one checkpoint at the end; the same global batch, so the same scaled rate.
SHORT = {"epochs": 2, "lr": {"base": 0.2}, "checkpoint": {"every_epochs": 2}}
MICRO_BATCHES, STEPS = 4, 3


def count_gradient_all_reduces(accumulation_steps: int, device: str) -> int:
    """Run STEPS optimizer steps through the loop's step on a DDP model; count gradient all-reduces."""
    config = job_config(
        MLP, device=device, config={"samples": 256}, batch={"per_worker": 8, "accumulation_steps": accumulation_steps}
    )
    spec, plan = JobSpec.model_validate(config["spec"]), TrainingPlan.model_validate(config["plan"])
    torch.manual_seed(0)
    workload = load_workload(spec.workload)(spec.config, spec.seed)
    on = loop_device(config)
    state = build_train_state(workload, spec, plan, on, world_size=2)
    calls = []

    def counting_hook(process_group, bucket):
        calls.append(bucket.index())
        return allreduce_hook(process_group, bucket)

    state.model.register_comm_hook(None, counting_hook)
    batches = TrainBatches(
        workload.train_dataset,
        rank=torch.distributed.get_rank(),
        world_size=2,
        per_worker=8,
        accumulation_steps=accumulation_steps,
        seed=0,
    )
    assert batches.steps_per_epoch >= STEPS
    for micro_batches, _ in zip(batches.epoch(1), range(STEPS), strict=False):
        assert len(micro_batches) == accumulation_steps
        optimizer_step(state, micro_batches, workload.loss_fn, device=on, precision="fp32", grad_clip_norm=None)
    return len(calls)


@pytest.fixture(scope="module", params=backends(2))
def backend(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def runs(backend, tmp_path_factory):
    work = tmp_path_factory.mktemp(f"ddp-{backend}")
    device = DEVICE_OF[backend]
    configs = {
        "2x8": job_config(MLP, device=device, batch={"per_worker": 8}, **SHORT),
        "2x4x4": job_config(MLP, device=device, batch={"per_worker": 4, "accumulation_steps": 4}, **SHORT),
        "sync-bn": job_config(BN_MLP, device=device, sync_batchnorm=True, batch={"per_worker": 8}, **SHORT),
        "plain-bn": job_config(BN_MLP, device=device, batch={"per_worker": 8}, **SHORT),
    }
    counts = {"device": device}
    tasks = {
        **{name: (train, {"config": config, "root": work / name}) for name, config in configs.items()},
        "all-reduces-accumulating": (count_gradient_all_reduces, {"accumulation_steps": MICRO_BATCHES, **counts}),
        "all-reduces-plain": (count_gradient_all_reduces, {"accumulation_steps": 1, **counts}),
        "sync-bn-layers": (batchnorm_layer_types, {"config": configs["sync-bn"]}),
    }
    results = run_on_ranks(list(tasks.values()), work, backend=backend)
    return [dict(zip(tasks, rank_results, strict=True)) for rank_results in results]


def batchnorm_layer_types(config: dict) -> list[str]:
    """The BatchNorm layers' classes of the model the loop would train for ``config`` on this rank."""
    spec, plan = JobSpec.model_validate(config["spec"]), TrainingPlan.model_validate(config["plan"])
    workload = load_workload(spec.workload)(spec.config, spec.seed)
    state = build_train_state(workload, spec, plan, loop_device(config), world_size=2)
    return [type(m).__name__ for m in state.model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


def final_state(run: dict) -> dict[str, torch.Tensor]:
    return model_state(run["checkpoints"][-1])


def one_worker(tmp_path, name: str, backend: str, workload: str = MLP, **batch) -> dict[str, torch.Tensor]:
    config = job_config(workload, workers=1, device=DEVICE_OF[backend], batch=batch, **SHORT)
    return final_state(train(config, tmp_path / name))


def test_two_workers_match_one_worker_with_twice_the_batch(runs, backend, tmp_path):
    reference = one_worker(tmp_path, "1x16", backend, per_worker=16)
    assert_same_state(final_state(runs[0]["2x8"]), reference, atol=1e-6, rtol=1e-5)


def test_accumulated_micro_batches_match_one_big_batch(runs, backend, tmp_path):
    reference = one_worker(tmp_path, "1x32", backend, per_worker=32)
    accumulated = one_worker(tmp_path, "1x8x4", backend, per_worker=8, accumulation_steps=4)
    assert_same_state(accumulated, reference, atol=1e-6, rtol=1e-5)
    # and over 2 workers x 4 micro-batches of 4: the same global batch of 32
    assert_same_state(final_state(runs[0]["2x4x4"]), reference, atol=1e-6, rtol=1e-5)


def test_gradients_are_all_reduced_once_per_optimizer_step(runs):
    for rank in runs:
        # the model fits one DDP bucket: one all-reduce per step, not one per micro-batch (4 x 3)
        assert rank["all-reduces-plain"] == STEPS
        assert rank["all-reduces-accumulating"] == STEPS


def test_sync_batchnorm_matches_one_worker_with_plain_batchnorm(runs, backend, tmp_path):
    # CpuSyncBatchNorm over gloo; torch's own nn.SyncBatchNorm over NCCL
    expected = {"gloo": "CpuSyncBatchNorm", "nccl": "SyncBatchNorm"}[backend]
    assert all(rank["sync-bn-layers"] == [expected] for rank in runs)
    reference = one_worker(tmp_path, "bn-1x16", backend, BN_MLP, per_worker=16)
    synced = final_state(runs[0]["sync-bn"])
    assert_same_state(synced, reference, atol=1e-5, rtol=1e-5)  # weights and running statistics
    # Without it each rank normalises its own half-batch: visibly different.
    unsynced = final_state(runs[0]["plain-bn"])
    assert not torch.allclose(unsynced["1.running_var"], reference["1.running_var"], atol=1e-4)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("momentum", [0.1, None])
@pytest.mark.parametrize("shape", [(16, 6), (8, 6, 5)])
def test_sync_batchnorm_alone_is_batchnorm(shape, momentum, device):
    """One process, no group: the converted layer (ours on the CPU, torch's ``nn.SyncBatchNorm`` on CUDA)
    computes what BatchNorm does, gradients included."""
    torch.manual_seed(0)
    plain = nn.Sequential(nn.BatchNorm1d(6, momentum=momentum)).to(device)
    with torch.no_grad():
        plain[0].weight.uniform_(0.5, 1.5)
        plain[0].bias.uniform_(-0.5, 0.5)
    synced = convert_sync_batchnorm(copy.deepcopy(plain), torch.device(device))
    assert isinstance(synced[0], CpuSyncBatchNorm if device == "cpu" else nn.SyncBatchNorm)
    for _ in range(3):
        x = torch.randn(shape, device=device) * 3 + 1
        outputs = [model(x) for model in (plain, synced)]
        torch.testing.assert_close(outputs[1], outputs[0], atol=1e-5, rtol=1e-5)
        for out in outputs:
            (out * torch.arange(out.numel(), device=device).reshape(out.shape)).sum().backward()
    assert_same_state(synced.state_dict(), plain.state_dict(), atol=1e-5, rtol=1e-5)
    for a, b in zip(plain.parameters(), synced.parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(synced.eval()(x), plain.eval()(x))
