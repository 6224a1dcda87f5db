"""Job spec validation: defaults, and a clear error naming the field for everything invalid."""

import pytest
from pydantic import ValidationError

from workers.spec import DigitsConfig, EventBatch, JobSpec


def test_only_workload_is_required_and_defaults_are_filled_in():
    spec = JobSpec(workload="digits")
    assert spec.scaling.num_workers == 2 and spec.scaling.gpus_per_worker == 0
    assert spec.config == DigitsConfig().model_dump()  # the stored spec is the complete one
    assert spec.strategy == "ddp" and spec.checkpoint.every_epochs == 1


def test_use_gpu_defaults_to_one_gpu_per_worker():
    spec = JobSpec(workload="digits", scaling={"num_workers": 4, "use_gpu": True})
    assert spec.scaling.total_resources() == {"CPU": 4.0, "GPU": 4.0}


@pytest.mark.parametrize(
    ("body", "loc", "words"),
    [
        ({}, ("workload",), "Field required"),
        ({"workload": "mnist"}, ("workload",), "unknown workload"),
        ({"workload": "os.system; rm -rf /"}, ("workload",), "unknown workload"),
        ({"workload": "digits", "config": {"epochs": -1}}, ("epochs",), "greater than or equal to 1"),
        ({"workload": "digits", "config": {"epoch": 3}}, ("config", "epoch"), "Extra inputs"),
        ({"workload": "digits", "scaling": {"num_workers": 0}}, ("scaling", "num_workers"), "greater than or equal to 1"),
        ({"workload": "digits", "scaling": {"gpus_per_worker": 1}}, ("scaling",), "needs use_gpu"),
        ({"workload": "digits", "strategy": "horovod"}, ("strategy",), "'ddp'"),
        ({"workload": "digits", "retries": {"max_attempts": 0}}, ("retries", "max_attempts"), "greater than"),
        ({"workload": "digits", "labels": {"team": "a b"}}, ("labels", "team"), "pattern"),
        ({"workload": "digits", "colour": "red"}, ("colour",), "Extra inputs"),
    ],
)
def test_invalid_specs_name_the_field(body, loc, words):
    with pytest.raises(ValidationError) as info:
        JobSpec.model_validate(body)
    errors = info.value.errors()
    assert any(tuple(e["loc"])[-len(loc):] == loc and words in e["msg"] for e in errors), errors


def test_custom_workload_syntax_is_accepted_by_the_contract():
    # Whether its package is allowed is the server's decision (see the API tests).
    assert JobSpec(workload="mypkg.train:build", config={"anything": 1}).config == {"anything": 1}


def test_event_batch_rejects_unknown_event_types():
    with pytest.raises(ValidationError):
        EventBatch.model_validate({"attempt": 1, "events": [{"type": "bogus"}]})
