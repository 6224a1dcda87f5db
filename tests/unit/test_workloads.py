"""Built-in workloads (digits, tiny_gpt), the custom-workload example and the workload registry."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from pydantic import Field
from torch import nn

from orchestrator_contract import workloads
from orchestrator_contract.jobs import JobSpec
from orchestrator_contract.sweeps import SweepSpec
from orchestrator_contract.workloads import DigitsConfig, TinyGptConfig
from workers.workloads import digits, load_model_builder, load_workload, tiny_gpt
from workers.workloads.base import Workload, flat_cross_entropy

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SENTENCE = "The {n}th quick brown fox jumps over {m} lazy dogs.\n"


def param_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def loss_after_steps(workload: Workload, steps: int, lr: float, batch: int = 32) -> tuple[float, float]:
    """Loss on one fixed batch before and after ``steps`` Adam steps on it."""
    x, y = next(iter(torch.utils.data.DataLoader(workload.train_dataset, batch_size=batch, shuffle=False)))
    model = workload.model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    first = None
    for _ in range(steps):
        loss = workload.loss_fn(model(x), y)
        first = loss.item() if first is None else first
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        return first, workload.loss_fn(model(x), y).item()


@pytest.fixture
def text_file(tmp_path) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text("".join(SENTENCE.format(n=i, m=3 * i % 17) for i in range(300)), encoding="utf-8")
    return path


def gpt_config(text_file: Path, **overrides) -> dict:
    config = {"text_path": str(text_file), "context": 16, "layers": 2, "width": 32, "heads": 4}
    return {**config, **overrides}


# --- parameter counts match the spec's formulas (the planner relies on them) ------------------------


@pytest.mark.parametrize("config", [{}, {"hidden": 7}, {"batchnorm": True}, {"hidden": 300, "batchnorm": True}])
def test_digits_param_count_matches_spec(config):
    model = digits.build_model(config)
    assert param_count(model) == DigitsConfig(**config).param_count()
    if config.get("batchnorm"):
        assert isinstance(model[2], nn.BatchNorm1d)  # Standardize, Linear, BatchNorm1d, ReLU, Linear


@pytest.mark.parametrize(
    "config",
    [
        {},
        {"layers": 1, "width": 8, "heads": 1, "context": 2},
        {"layers": 3, "width": 48, "heads": 6, "context": 100, "vocab_size": 128},
        {"layers": 2, "width": 2048, "heads": 16, "context": 1024},  # wide: built on the meta device
    ],
)
def test_tiny_gpt_param_count_matches_spec(config):
    config = {"text_path": "not-read.txt", **config}
    with torch.device("meta"):
        model = tiny_gpt.build_model(config)
    assert param_count(model) == TinyGptConfig(**config).param_count()


# --- digits -------------------------------------------------------------------------------------------


def test_digits_split_sizes_and_seeding():
    first = digits.build({}, seed=0)
    assert len(first.train_dataset) + len(first.val_dataset) == 1797
    assert len(first.val_dataset) == pytest.approx(0.2 * 1797, abs=1)

    again = digits.build({}, seed=0)
    other = digits.build({}, seed=1)
    assert torch.equal(first.val_dataset.tensors[0], again.val_dataset.tensors[0])
    assert not torch.equal(first.val_dataset.tensors[0], other.val_dataset.tensors[0])
    assert len(digits.build({"val_fraction": 0.5}, seed=0).val_dataset) == pytest.approx(1797 / 2, abs=1)


def test_the_digits_split_is_kept_on_disk_exactly_as_scikit_learn_made_it(tmp_path, monkeypatch):
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    monkeypatch.setattr(digits.tempfile, "gettempdir", lambda: str(tmp_path))
    features, labels = load_digits(return_X_y=True)
    expected = train_test_split(features, labels, test_size=0.25, random_state=3, stratify=labels)

    first = digits.split(3, 0.25)
    (cached,) = (tmp_path / "orchestrator-cache").glob("digits-*-3-0.25.npz")
    again = digits.split(3, 0.25)  # from the file this time
    for ours, theirs, from_file in zip(first, expected, again, strict=True):
        assert (ours == theirs).all() and (from_file == theirs).all() and from_file.dtype == theirs.dtype
    cached.write_bytes(b"cut short")  # a damaged file is made again, not trusted
    assert all((a == b).all() for a, b in zip(digits.split(3, 0.25), expected, strict=True))
    assert cached.stat().st_size > 1000


def test_digits_standardization_is_fitted_on_the_train_split_only():
    workload = digits.build({"batchnorm": True}, seed=3)
    x_train = workload.train_dataset.tensors[0]
    x_all = torch.cat([x_train, workload.val_dataset.tensors[0]])
    standardize = workload.model[0]
    assert torch.allclose(standardize.mean, x_train.mean(dim=0))
    assert not torch.allclose(standardize.mean, x_all.mean(dim=0))
    assert (standardize.scale > 0).all()  # constant pixels keep scale 1
    # The buffers travel in the state dict, so a checkpoint serves raw pixels on its own.
    assert {"0.mean", "0.scale"} <= set(workload.model.state_dict())


# --- tiny_gpt -------------------------------------------------------------------------------------------


def test_tiny_gpt_datasets_are_shifted_non_overlapping_windows(text_file):
    workload = tiny_gpt.build(gpt_config(text_file), seed=0)
    data = text_file.read_bytes()
    split = int(len(data) * 0.9)
    assert len(workload.train_dataset) == (split - 1) // 16
    assert len(workload.val_dataset) == (len(data) - split - 1) // 16
    assert workload.targets_per_sample == 16

    x0, y0 = workload.train_dataset[0]
    x1, _ = workload.train_dataset[1]
    assert x0.shape == y0.shape == (16,) and x0.dtype == y0.dtype == torch.int64
    assert torch.equal(y0[:-1], x0[1:])
    assert bytes(x0.tolist()) == data[:16] and bytes(y0.tolist()) == data[1:17]
    assert bytes(x1.tolist()) == data[16:32]  # stride = context
    xv, _ = workload.val_dataset[0]
    assert bytes(xv.tolist()) == data[split : split + 16]
    with pytest.raises(IndexError):
        workload.train_dataset[len(workload.train_dataset)]


def test_tiny_gpt_output_shape_and_causality(text_file):
    torch.manual_seed(0)
    workload = tiny_gpt.build(gpt_config(text_file, dropout=0.1), seed=0)
    model = workload.model.eval()
    x = torch.stack([workload.train_dataset[i][0] for i in range(3)])
    with torch.no_grad():
        logits = model(x)
        assert logits.shape == (3, 16, 256)
        changed = x.clone()
        changed[:, 10] = (changed[:, 10] + 1) % 256
        after = model(changed)
    assert torch.allclose(logits[:, :10], after[:, :10], atol=1e-6)
    assert not torch.allclose(logits[:, 10:], after[:, 10:])


def test_tiny_gpt_fsdp_blocks_and_tied_head(text_file):
    workload = tiny_gpt.build(gpt_config(text_file, layers=3), seed=0)
    blocks = list(workload.fsdp_blocks(workload.model))
    assert blocks == list(workload.model.blocks) and len(blocks) == 3
    assert "token.weight" in workload.model.state_dict()
    assert not any(k.startswith("head") for k in workload.model.state_dict())


def test_tiny_gpt_explains_missing_short_and_out_of_vocab_text(tmp_path, text_file):
    missing = tmp_path / "nope.txt"
    with pytest.raises(ValueError, match="cannot read.*nope.txt"):
        tiny_gpt.build(gpt_config(missing), seed=0)
    with pytest.raises(ValueError, match="cannot read"):
        tiny_gpt.build(gpt_config(tmp_path), seed=0)  # a directory

    short = tmp_path / "short.txt"
    short.write_text("x" * 150)  # 135 train bytes, but only 15 to validate: context 16 needs 17
    with pytest.raises(ValueError, match=r"short.txt.*too short.*context \+ 1 = 17"):
        tiny_gpt.build(gpt_config(short), seed=0)
    short.write_bytes(b"")
    with pytest.raises(ValueError, match="too short"):
        tiny_gpt.build(gpt_config(short), seed=0)
    short.write_text("x" * 170)  # 153 + 17: just enough
    assert len(tiny_gpt.build(gpt_config(short), seed=0).val_dataset) == 1

    utf8 = tmp_path / "utf8.txt"
    utf8.write_text("héllo wörld " * 50, encoding="utf-8")
    with pytest.raises(ValueError, match="outside vocab_size 128"):
        tiny_gpt.build(gpt_config(utf8, vocab_size=128), seed=0)
    assert len(tiny_gpt.build(gpt_config(utf8), seed=0).train_dataset) > 0


# --- a few optimizer steps lower the loss ------------------------------------------------------------


def test_a_few_steps_lower_the_loss_on_tiny_gpt(text_file):
    torch.manual_seed(0)
    workload = tiny_gpt.build(gpt_config(text_file), seed=0)
    assert workload.loss_fn is flat_cross_entropy
    before, after = loss_after_steps(workload, steps=15, lr=3e-3, batch=16)
    assert before == pytest.approx(torch.log(torch.tensor(256.0)).item(), rel=0.1)  # near uniform
    assert after < before - 1.0


@pytest.mark.parametrize("batchnorm", [False, True])
def test_a_few_steps_lower_the_loss_on_digits(batchnorm):
    torch.manual_seed(0)
    before, after = loss_after_steps(digits.build({"batchnorm": batchnorm}, seed=0), steps=10, lr=1e-2)
    assert after < before * 0.5


# --- registry and the custom-workload example ---------------------------------------------------------


def test_registry_holds_both_builtins(text_file):
    assert workloads.names() == ["digits", "tiny_gpt"]
    assert all(workloads.get(name).build_model is not None for name in workloads.names())
    assert load_workload("tiny_gpt") is tiny_gpt.build
    assert load_model_builder("tiny_gpt") is tiny_gpt.build_model
    assert load_workload("workers.workloads.tiny_gpt:build") is tiny_gpt.build


@pytest.fixture
def examples_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))


@pytest.mark.parametrize("name", ["digits", "tiny_gpt"])
def test_a_builtins_predictor_lives_beside_its_model_and_takes_its_example_request(name, text_file):
    """A built-in is its module (model, data, predictor) and its descriptor: serving loads the predictor the
    descriptor names from the workload's own module, and the example the dashboard offers is a body it takes."""
    descriptor = workloads.get(name)
    assert descriptor.predictor.startswith(f"workers.workloads.{name}:"), descriptor.predictor
    assert descriptor.example_request, "the dashboard's try-it form starts from it"
    config = (
        {"hidden": 16} if name == "digits" else {"text_path": str(text_file), "context": 8, "width": 16, "heads": 2}
    )
    config = descriptor.validate_config(config)
    predictor = descriptor.load_predictor()(descriptor.load_model_builder()(config).eval(), config)
    (answer,) = predictor.predict([predictor.parse(dict(descriptor.example_request))])
    assert answer.get("predictions") or answer.get("text") is not None, answer


def test_spirals_example_through_the_registry(examples_on_path):
    build = load_workload("example_workloads.spirals:build")
    workload = build({"points": 500}, 7)
    assert len(workload.train_dataset) + len(workload.val_dataset) == 500
    x, y = workload.train_dataset[:]
    assert x.shape[1] == 2 and set(y.tolist()) == {0, 1}
    assert torch.equal(x, build({"points": 500}, 7).train_dataset[:][0])  # same seed, same data
    assert not torch.equal(x, build({"points": 500}, 8).train_dataset[:][0])

    torch.manual_seed(0)
    before, after = loss_after_steps(build({"points": 500, "hidden": 32}, 0), steps=20, lr=1e-2, batch=128)
    assert after < before

    model = load_model_builder("example_workloads.spirals:build")({"hidden": 16})
    assert model(torch.zeros(4, 2)).shape == (4, 2)
    with pytest.raises(ValueError, match="unknown config keys.*hiden"):
        build({"hiden": 3}, 0)


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("spirals", "malformed workload name 'spirals'"),
        ("example_workloads.spirals", "malformed"),
        ("example_workloads/spirals:build", "malformed"),
        ("example_workloads.nope:build", "module 'example_workloads.nope' is not installed"),
        ("not_installed_pkg.spirals:build", "module 'not_installed_pkg.spirals' is not installed"),
        ("example_workloads.spirals:nope", "'example_workloads.spirals' has no function 'nope'"),
        ("example_workloads.spirals:DEFAULTS", "has no function 'DEFAULTS'"),  # not callable
    ],
)
def test_load_workload_explains_bad_names(examples_on_path, name, problem):
    with pytest.raises(ValueError, match=problem):
        load_workload(name)


def test_a_missing_import_inside_a_workload_module_is_shown_as_it_is(tmp_path, monkeypatch):
    (tmp_path / "broken_workloads.py").write_text("import not_a_real_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError, match="not_a_real_dependency"):
        load_workload("broken_workloads:build")


# --- one registry that every part of the service asks ------------------------------------------------


def test_the_registry_and_the_contract_import_neither_torch_nor_ray():
    import subprocess
    import sys

    code = (
        "import sys, orchestrator_contract.workloads, orchestrator_contract.jobs, workers.workloads; "
        "print(sorted(m for m in ('torch', 'ray', 'sqlalchemy') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_checkpoint_metrics_are_the_loops_metrics():
    from orchestrator_contract.jobs import CHECKPOINT_METRICS

    assert CHECKPOINT_METRICS == workloads.LOOP_METRICS
    for name in workloads.names():
        assert workloads.get(name).selection == ("val_accuracy", True)


def test_a_metrics_default_mode_is_the_loops_then_the_descriptors_else_required():
    descriptor = workloads.register(
        workloads.WorkloadDescriptor(
            name="toy_regression",
            build=build_toy,
            metrics={"val_mae": "min", "val_r2": "max", "val_loss": "min"},
            selection_metric="val_r2",
        )
    )
    try:
        assert workloads.metric_mode("toy_regression", "val_mae") == "min"
        assert workloads.metric_mode("toy_regression", "val_r2") == "max"
        assert workloads.metric_mode("toy_regression", "samples_per_s") == "max"  # the loop's, as always
        assert workloads.metric_mode("pkg.mod:build", "val_loss") == "min"
        for workload in ("digits", "pkg.mod:build", "toy_regression"):
            with pytest.raises(ValueError, match=r"mode is required for metric 'val_f1' \(max or min\)"):
                workloads.metric_mode(workload, "val_f1")
        # The specs that name a metric take the descriptor's mode.
        job = JobSpec(workload="toy_regression", checkpoint={"keep_best": {"metric": "val_r2"}})
        assert job.checkpoint.keep_best.mode == "max"
        lr = {"lr.base": {"type": "choice", "values": [0.1]}}
        sweep = SweepSpec(base={"workload": "toy_regression"}, search_space=lr, metric="val_mae")
        assert sweep.mode == "min"
    finally:
        workloads.unregister(descriptor.name)
    with pytest.raises(ValueError, match="no spaces or control characters"):
        workloads.WorkloadDescriptor(
            name="bad", build=build_toy, metrics={"val mae": "min"}, selection_metric="val mae"
        )


class ToyConfig(workloads.WorkloadConfig):
    hidden: int = 4
    data: str = Field("toy.txt", json_schema_extra={workloads.DATA_PATH: True})

    def param_count(self) -> int:
        return 3 * self.hidden


def build_toy(config: dict, seed: int) -> Workload:
    return spirals_like(ToyConfig.model_validate(config).hidden)


def spirals_like(hidden: int) -> Workload:
    x, y = torch.zeros(8, 2), torch.zeros(8, dtype=torch.long)
    data = torch.utils.data.TensorDataset(x, y)
    return Workload(
        model=nn.Sequential(nn.Linear(2, hidden), nn.Linear(hidden, 2)), train_dataset=data, val_dataset=data
    )


class ToyPredictor:
    def __init__(self, model: nn.Module, config: dict):
        self.model, self.config = model, config


@pytest.fixture
def toy():
    descriptor = workloads.register(
        workloads.WorkloadDescriptor(
            name="toy",
            config_model=ToyConfig,
            build=build_toy,
            predictor=ToyPredictor,
            metrics={"val_loss": "min", "val_accuracy": "max"},
            selection_metric="val_loss",
            param_count=ToyConfig.param_count,
        )
    )
    yield descriptor
    workloads.unregister("toy")


def test_a_workload_registered_once_is_known_everywhere(toy):
    from orchestrator.planner import PlanRequest, plan_job
    from orchestrator.services.deployments import selection_metric
    from orchestrator_contract.jobs import JobSpec
    from orchestrator_contract.sweeps import check_path
    from workers.serve.app import check_servable, make_predictor

    spec = JobSpec(workload="toy", config={"hidden": 5}, strategy="auto")
    assert spec.config == {"hidden": 5, "data": "toy.txt"}  # completed by its config model
    with pytest.raises(ValueError, match="hiden"):
        JobSpec(workload="toy", config={"hiden": 5})
    assert PlanRequest(workload="toy", config={"hidden": 5}, gpu_memory_gb=1).params == 15
    assert plan_job(spec).strategy == "ddp" and "planner:" in plan_job(spec).reason
    assert toy.data_path_fields == ["data"]  # what the control plane checks against the data roots at submit
    with pytest.raises(ValueError, match="no field 'nope'"):
        check_path(spec.model_copy(update={"strategy": "ddp"}), "config.nope", None)
    assert workloads.selection_of("toy") == ("val_loss", False)  # the checkpoint a deployment picks
    assert selection_metric(SimpleNamespace(workload="toy", spec={})) == ("val_loss", False)
    assert workloads.servable_names() == ["digits", "tiny_gpt", "toy"]

    assert load_workload("toy") is build_toy
    model = load_model_builder("toy")({"hidden": 6})  # no build_model: the whole workload, seed 0
    assert model[0].out_features == 6
    check_servable("toy")
    predictor = make_predictor("toy", model, {"hidden": 6})
    assert isinstance(predictor, ToyPredictor) and predictor.model is model

    workloads.unregister("toy")
    with pytest.raises(ValueError, match="unknown workload 'toy'"):
        JobSpec(workload="toy")
    with pytest.raises(ValueError, match=r"serving supports the workloads \['digits', 'tiny_gpt'\]"):
        check_servable("toy")


def test_registering_checks_the_name_and_the_metrics(toy):
    with pytest.raises(ValueError, match="already registered"):
        workloads.register(workloads.WorkloadDescriptor(name="toy", build=build_toy))
    assert workloads.register(toy) is toy  # the same descriptor again: nothing changes
    with pytest.raises(ValueError, match="need no registering"):
        workloads.register(workloads.WorkloadDescriptor(name="pkg.mod:fn", build=build_toy))
    with pytest.raises(ValueError, match="selection_metric 'bleu' is not one of its metrics"):
        workloads.WorkloadDescriptor(name="x", build=build_toy, selection_metric="bleu")
    with pytest.raises(ValueError, match="'max' or 'min'"):
        workloads.WorkloadDescriptor(name="x", build=build_toy, metrics={"val_accuracy": "up"})


def test_a_custom_name_may_resolve_to_a_whole_descriptor(tmp_path, monkeypatch):
    (tmp_path / "toy_package.py").write_text(
        "from orchestrator_contract.workloads import WorkloadDescriptor\n"
        "WORKLOAD = WorkloadDescriptor(name='toy_package', build='tests.unit.test_workloads:build_toy',\n"
        "                              predictor='tests.unit.test_workloads:ToyPredictor')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    # The control plane imports nothing of it: a generic descriptor, served as rows.
    assert workloads.describe("toy_package:WORKLOAD").predictor is None
    assert load_workload("toy_package:WORKLOAD") is build_toy  # on the cluster: its own descriptor
    assert workloads.resolve("toy_package:WORKLOAD").load_predictor() is ToyPredictor
