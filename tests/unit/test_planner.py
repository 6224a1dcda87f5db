"""The planner against cases worked by hand (units: 1 GB = 1e9 bytes)."""

import pytest
from pydantic import ValidationError

from orchestrator.planner import DoesNotFit, PlanRequest, bytes_per_param, plan, plan_job
from orchestrator_contract.jobs import DigitsConfig, JobSpec

ISSUE_EXAMPLE = dict(
    params=2e9,
    precision="bf16",
    optimizer="adam",
    gpus=8,
    gpu_memory_gb=16,
    activation_gb=3,
    per_gpu_batch=16,
    accumulation_steps=2,
    base_lr=0.1,
    base_batch=256,
    lr_scaling="linear",
    bandwidth_gb_s=25,
    latency_us=5,
)


def test_bytes_per_parameter():
    assert bytes_per_param("bf16", "adam").total == 16  # 2 + 2 + (4 master + 4 + 4)
    assert bytes_per_param("fp32", "adam").total == 16  # 4 + 4 + 8
    assert bytes_per_param("fp32", "sgd").total == 12  # 4 + 4 + 4
    assert bytes_per_param("bf16", "adam").optimizer == 12


def test_the_issue_example_by_hand():
    answer = plan(PlanRequest(**ISSUE_EXAMPLE))
    s = answer.strategies
    # ddp: 16 B x 2e9 = 32 GB + 3 GB activations.
    assert s["ddp"].per_gpu_gb == pytest.approx(35) and not s["ddp"].fits
    # zero1: weights 4 + grads 4 + optimizer 24 / 8 = 3, + 3 = 14.
    assert s["zero1"].per_gpu_gb == pytest.approx(14) and s["zero1"].fits
    assert s["zero1"].breakdown_gb == pytest.approx({"weights": 4, "gradients": 4, "optimizer": 3, "activations": 3})
    # zero2: 4 + 4/8 + 3 + 3 = 10.5.
    assert s["zero2"].per_gpu_gb == pytest.approx(10.5)
    # fsdp: 32 / 8 + 3 = 7.
    assert s["fsdp"].per_gpu_gb == pytest.approx(7)
    assert answer.recommended == "fsdp" and answer.shortfall_gb == 0
    assert answer.global_batch == 256 and answer.lr == pytest.approx(0.1)
    # 2 * 7/8 * (2e9 params x 2 B) / 25e9 B/s = 0.28 s, + 7 hops x 5 us.
    assert answer.allreduce_ms == pytest.approx(280.035)


def test_small_model_gets_ddp_and_lr_scales():
    answer = plan(PlanRequest(**{**ISSUE_EXAMPLE, "params": 1e8, "per_gpu_batch": 64, "lr_scaling": "sqrt"}))
    assert answer.recommended == "ddp" and "ddp fits" in answer.reason
    assert answer.global_batch == 1024 and answer.lr == pytest.approx(0.1 * 2)  # sqrt(1024 / 256)


def test_too_big_says_by_how_much():
    answer = plan(PlanRequest(**{**ISSUE_EXAMPLE, "params": 2e10}))
    # fsdp: 16 x 2e10 / 8 = 40 GB + 3 = 43 GB on a 16 GB GPU: 27 GB short.
    assert answer.recommended is None and answer.shortfall_gb == pytest.approx(27)
    assert "does not fit" in answer.reason and "27 GB more" in answer.reason


def test_one_gpu_has_no_all_reduce():
    assert plan(PlanRequest(**{**ISSUE_EXAMPLE, "gpus": 1})).allreduce_ms == 0


def test_workload_instead_of_params():
    answer = plan(PlanRequest(workload="digits", config={"hidden": 256}, gpu_memory_gb=1, precision="fp32"))
    assert answer.params == DigitsConfig(hidden=256).param_count() == 64 * 256 + 256 + 2560 + 10


@pytest.mark.parametrize(
    "body",
    [
        {"gpu_memory_gb": 16},  # neither params nor workload
        {"params": 1e6, "workload": "digits", "gpu_memory_gb": 16},  # both
        {"workload": "mypkg.m:f", "gpu_memory_gb": 16},  # can't count a custom workload
        {"params": -1, "gpu_memory_gb": 16},
    ],
)
def test_bad_requests(body):
    with pytest.raises(ValidationError):
        PlanRequest(**body)


def test_auto_strategy_for_a_job_records_the_choice_and_why():
    small = plan_job(JobSpec(workload="digits", strategy="auto"))
    assert small.strategy == "ddp" and small.reason.startswith("planner: ddp fits")
    # A 2-layer, width-1024 tiny_gpt with Adam in fp32 (~25.5M params x 16 B = 0.41 GB) on 0.3 GB workers.
    big = JobSpec(
        workload="tiny_gpt",
        strategy="auto",
        config={"text_path": "t", "width": 1024, "heads": 8},
        optimizer={"name": "adamw"},
        scaling={"num_workers": 2, "memory_per_worker_gb": 0.3},
    )
    chosen = plan_job(big)
    assert chosen.strategy == "fsdp" and "fsdp over 2 GPUs" in chosen.reason
    with pytest.raises(DoesNotFit):
        plan_job(big.model_copy(update={"scaling": big.scaling.model_copy(update={"memory_per_worker_gb": 0.1})}))
    explicit = plan_job(JobSpec(workload="digits", strategy="fsdp", scaling={"num_workers": 4}))
    assert (explicit.strategy, explicit.reason, explicit.global_batch) == ("fsdp", "", 128)
    assert explicit.lr == pytest.approx(0.1)  # 0.05 tuned for 64, linear to 128
