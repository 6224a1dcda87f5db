"""Job spec validation: defaults, and a clear error naming the field for everything invalid."""

import pytest
from pydantic import ValidationError

from orchestrator.db.models import Sweep
from orchestrator_contract.jobs import DigitsConfig, EventBatch, JobSpec, TinyGptConfig, scale_lr
from tests.unit.api_helpers import ADMIN, auth


def test_only_workload_is_required_and_defaults_are_filled_in():
    spec = JobSpec(workload="digits")
    assert spec.scaling.num_workers == 2 and spec.scaling.gpus_per_worker == 0
    assert spec.config == DigitsConfig().model_dump()  # the stored spec is the complete one
    assert spec.strategy == "ddp" and spec.checkpoint.every_epochs == 1
    assert spec.precision == "fp32" and spec.epochs == 12


def test_global_batch_and_scaled_learning_rate():
    spec = JobSpec(
        workload="digits",
        scaling={"num_workers": 4},
        batch={"per_worker": 32, "accumulation_steps": 2},
        lr={"base": 0.1, "base_batch": 64},
    )
    assert spec.global_batch == 256
    assert spec.scaled_lr == pytest.approx(0.4)  # linear: 256 / 64 = 4x
    assert scale_lr(0.1, 64, 256, "sqrt") == pytest.approx(0.2)
    assert scale_lr(0.1, 64, 256, "none") == pytest.approx(0.1)


def test_fp16_is_fine_on_gpus():
    assert JobSpec(workload="digits", precision="fp16", scaling={"use_gpu": True}).precision == "fp16"


def test_tiny_gpt_parameter_formula_by_hand():
    # width 8, 1 layer, vocab 256, context 4: embeddings 2048 + 32; block 32 + 216 + 72 + 288 + 264 = 872;
    # final LayerNorm 16.
    assert TinyGptConfig(text_path="t", width=8, heads=2, layers=1, context=4).param_count() == 2048 + 32 + 872 + 16


def test_use_gpu_defaults_to_one_gpu_per_worker():
    spec = JobSpec(workload="digits", scaling={"num_workers": 4, "use_gpu": True})
    assert spec.scaling.total_resources() == {"CPU": 4.0, "GPU": 4.0}


@pytest.mark.parametrize(
    ("body", "loc", "words"),
    [
        ({}, (), "give exactly one of workload"),  # or entrypoint (a training function)
        ({"workload": "mnist"}, ("workload",), "unknown workload"),
        ({"workload": "os.system; rm -rf /"}, ("workload",), "unknown workload"),
        ({"workload": "digits", "epochs": -1}, ("epochs",), "greater than or equal to 1"),
        ({"workload": "digits", "config": {"epochs": 3}}, ("config", "epochs"), "Extra inputs"),
        ({"workload": "digits", "config": {"hiden": 3}}, ("config", "hiden"), "Extra inputs"),
        ({"workload": "digits", "config": {"epoch": 3}}, ("config", "epoch"), "Extra inputs"),
        (
            {"workload": "digits", "scaling": {"num_workers": 0}},
            ("scaling", "num_workers"),
            "greater than or equal to 1",
        ),
        ({"workload": "digits", "scaling": {"gpus_per_worker": 1}}, ("scaling",), "needs use_gpu"),
        ({"workload": "digits", "strategy": "horovod"}, ("strategy",), "'ddp'"),
        ({"workload": "digits", "retries": {"max_attempts": 0}}, ("retries", "max_attempts"), "greater than"),
        ({"workload": "digits", "labels": {"team": "a b"}}, ("labels", "team"), "pattern"),
        ({"workload": "digits", "colour": "red"}, ("colour",), "Extra inputs"),
        ({"workload": "tiny_gpt"}, ("config", "text_path"), "Field required"),
        (
            {"workload": "tiny_gpt", "config": {"text_path": "t", "width": 100, "heads": 3}},
            ("config",),
            "multiple of heads",
        ),
        ({"workload": "digits", "precision": "fp16"}, (), "fp16 needs GPUs"),
        ({"workload": "digits", "precision": "fp8"}, ("precision",), "'bf16'"),
        ({"workload": "digits", "strategy": "zero3"}, ("strategy",), "'fsdp'"),
        ({"workload": "digits", "batch": {"accumulation_steps": 0}}, ("batch", "accumulation_steps"), "greater than"),
        ({"workload": "digits", "lr": {"scaling": "cubic"}}, ("lr", "scaling"), "'linear'"),
        ({"workload": "digits", "grad_clip_norm": 0}, ("grad_clip_norm",), "greater than 0"),
        ({"workload": "digits", "optimizer": {"name": "lion"}}, ("optimizer", "name"), "'sgd'"),
    ],
)
def test_invalid_specs_name_the_field(body, loc, words):
    with pytest.raises(ValidationError) as info:
        JobSpec.model_validate(body)
    errors = info.value.errors()
    assert any(tuple(e["loc"])[len(e["loc"]) - len(loc) :] == loc and words in e["msg"] for e in errors), errors


def test_custom_workload_syntax_is_accepted_by_the_contract():
    # Whether its package is allowed is the server's decision (see the API tests).
    assert JobSpec(workload="mypkg.train:build", config={"anything": 1}).config == {"anything": 1}


def test_event_batch_rejects_unknown_event_types():
    with pytest.raises(ValidationError):
        EventBatch.model_validate({"attempt": 1, "events": [{"type": "bogus"}]})


LR = {"lr.base": {"type": "choice", "values": [0.1, 0.01]}}
KEEP_BEST = ("checkpoint", "keep_best", "metric")


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        # A metric the workload's checkpoints never carry (known from the registry): a 422, not a keep_best
        # that silently keeps nothing.
        ({"workload": "digits", "checkpoint": {"keep_best": {"metric": "val_mae", "mode": "min"}}}, "never reports"),
        (  # a step metric: never on a checkpoint
            {
                "workload": "tiny_gpt",
                "config": {"text_path": "t"},
                "checkpoint": {"keep_best": {"metric": "lr", "mode": "max"}},
            },
            "never reports 'lr'",
        ),
        # A report's position is no metric, whatever the job runs.
        (
            {"workload": "digits", "checkpoint": {"keep_best": {"metric": "step", "mode": "max"}}},
            "'step' is a report's position",
        ),
        (
            {"entrypoint": "allowed_pkg.train:main", "checkpoint": {"keep_best": {"metric": "epoch", "mode": "max"}}},
            "'epoch' is a report's position",
        ),
    ],
)
def test_a_keep_best_metric_the_run_never_reports_is_a_422_naming_the_field(client, spec, words):
    """Before, keep_best quietly kept no best checkpoint."""
    response = client.post("/v1/jobs", json=spec, headers=auth(ADMIN))
    assert response.status_code == 422, response.text
    [detail] = response.json()["detail"]
    assert detail["loc"] == ["body", *KEEP_BEST] and words in detail["msg"], detail
    assert client.get("/v1/jobs", headers=auth(ADMIN)).json()["items"] == []


@pytest.mark.parametrize(
    ("base", "metric", "loc", "words"),
    [
        ({"workload": "digits"}, "val_mae", ["metric"], "workload 'digits' never reports 'val_mae'"),
        ({"workload": "digits"}, "epoch", ["metric"], "'epoch' is a report's position"),
        ({"entrypoint": "allowed_pkg.train:main"}, "step", ["metric"], "'step' is a report's position"),
        (  # the base's own keep_best, checked as a job's
            {"workload": "digits", "checkpoint": {"keep_best": {"metric": "val_mae", "mode": "min"}}},
            "val_loss",
            ["base", *KEEP_BEST],
            "never reports 'val_mae'",
        ),
    ],
)
def test_a_sweeps_metric_its_trials_never_report_is_a_422_naming_the_field(client, base, metric, loc, words):
    """Before, such a sweep was accepted and Ray Tune failed it at its first result ("Trial returned a result
    which did not include the specified metric"), or its best trial was never found (a position)."""
    sweep = {"base": base, "search_space": LR, "metric": metric, "mode": "min"}
    response = client.post("/v1/sweeps", json=sweep, headers=auth(ADMIN))
    assert response.status_code == 422, response.text
    [detail] = response.json()["detail"]
    assert detail["loc"] == ["body", *loc] and words in detail["msg"], detail
    assert client.get("/v1/sweeps", headers=auth(ADMIN)).json() == []


def test_a_metric_longer_than_the_servers_cap_is_a_422_at_submit(app, client):
    """The events route refuses a report whose metric name is over ORCHESTRATOR_MAX_METRIC_NAME_CHARS, and the
    driver drops a refused batch: a keep_best on such a name would never see a checkpoint recorded."""
    app.state.service.settings.max_metric_name_chars = 8
    spec = {
        "entrypoint": "allowed_pkg.train:main",
        "checkpoint": {"keep_best": {"metric": "a_long_loss", "mode": "min"}},
    }
    response = client.post("/v1/jobs", json=spec, headers=auth(ADMIN))
    assert response.status_code == 422 and "at most 8" in response.json()["detail"][0]["msg"], response.text


def test_a_metric_known_only_when_the_run_reports_it_is_accepted_with_its_mode(client):
    """A training function's metrics are its ctx.report calls, and a "package.module:function" workload's its
    code's: neither is known before it runs, so the spec's metric is taken at its word."""
    function = {"entrypoint": "allowed_pkg.train:main"}
    keep_loss = {"keep_best": {"metric": "loss", "mode": "min"}}
    assert client.post("/v1/jobs", json={**function, "checkpoint": keep_loss}, headers=auth(ADMIN)).status_code == 201
    sweep = {"base": function, "search_space": LR, "metric": "loss", "mode": "min"}
    assert client.post("/v1/sweeps", json=sweep, headers=auth(ADMIN)).status_code == 201
    # The loop's own epoch metrics are on every workload's checkpoints.
    custom = {"workload": "allowed_pkg.train:build"}
    assert JobSpec(**custom, checkpoint={"keep_best": {"metric": "samples_per_s"}}).checkpoint.keep_best.mode == "max"


def test_a_stored_spec_that_a_later_submit_check_refuses_is_still_read(app, client):
    """The submit-time metric checks are not rules of the model: a sweep stored before them (Tune then failed it)
    is read back by every route that re-reads its spec. With the check in the model, GET /v1/sweeps was a 500."""
    sweep = {"base": {"workload": "digits"}, "search_space": LR, "metric": "val_loss", "mode": "min"}
    created = client.post("/v1/sweeps", json=sweep, headers=auth(ADMIN)).json()
    with app.state.service.sessions() as session:
        row = session.get(Sweep, created["id"])
        row.spec = {**row.spec, "metric": "val_mae"}  # what a sweep submitted before the check holds
        session.commit()
    assert client.get("/v1/sweeps", headers=auth(ADMIN)).status_code == 200
    assert client.get(f"/v1/sweeps/{created['id']}", headers=auth(ADMIN)).json()["metric"] == "val_mae"
