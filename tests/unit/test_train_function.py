"""Training functions (a spec's ``entrypoint``, ``main(ctx)``): the spec, the submit checks, sweeps over one,
and the function runner on ``LocalContext`` (no Ray): it trains, checkpoints, is killed and resumes exactly.

The function run here is the example's, ``examples/own_code/train_function/train.py``, imported from its folder
as the cluster imports it from the job's working directory."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from pydantic import ValidationError

from orchestrator.db.models import Job
from orchestrator.planner import plan_job
from orchestrator_contract.jobs import JobSpec, MetricsEvent, StateEvent, TrainingPlan
from orchestrator_contract.metrics import DEFAULT_MAX_METRIC_NAMES
from orchestrator_contract.sweeps import SweepSpec, trial_spec
from tests.unit.api_helpers import ADMIN, auth, make_project
from tests.unit.harness import RecordingReporter, assert_same_state, loop_config, run_on_ranks
from tests.unit.test_code_in_jobs import upload
from tests.unit.test_deployments import app_of, deploy, finished_job, reconcile
from workers.runtime.context import LocalContext, latest_checkpoint
from workers.runtime.function import CONTEXT_FILE, TrainContext, run_function
from workers.runtime.manifest import verify_checkpoint
from workers.runtime.train_loop import PREEMPTED_KEY

EXAMPLE = Path(__file__).parents[2] / "examples" / "own_code" / "train_function"
CODE = {"id": "sha256:" + "0" * 64}


# --- the spec ------------------------------------------------------------------------------------------


def test_an_entrypoint_spec_validates_and_runs_its_function():
    spec = JobSpec(entrypoint="train:main", code=CODE, config={"hidden": 8})
    assert spec.workload is None and spec.runs == "train:main" and spec.config == {"hidden": 8}
    assert JobSpec(workload="digits").runs == "digits"  # a workload spec means what it meant


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({}, "give exactly one of workload"),
        ({"workload": "digits", "entrypoint": "train:main"}, "not both"),
        ({"entrypoint": "train"}, '"module:function"'),
        ({"entrypoint": "train:main; rm -rf /"}, '"module:function"'),
    ],
)
def test_exactly_one_of_workload_and_a_well_formed_entrypoint(fields, message):
    with pytest.raises(ValidationError, match=message):
        JobSpec(**fields)


def test_a_functions_keep_best_and_sweep_metric_need_a_mode_unless_the_loop_knows_it():
    # A function's job has no workload descriptor to ask: the loop's metrics keep their modes, any other a 422.
    spec = JobSpec(entrypoint="train:main", code=CODE, checkpoint={"keep_best": {"metric": "val_loss"}})
    assert spec.checkpoint.keep_best.mode == "min"
    with pytest.raises(ValidationError, match="mode is required for metric 'val_mae'"):
        JobSpec(entrypoint="train:main", code=CODE, checkpoint={"keep_best": {"metric": "val_mae"}})
    space = {"lr.base": {"type": "grid", "values": [0.1, 0.01]}}
    base = {"entrypoint": "train:main", "code": CODE}
    with pytest.raises(ValidationError, match="mode is required"):
        SweepSpec(base=base, search_space=space, algorithm="grid", metric="val_mae")
    assert SweepSpec(base=base, search_space=space, algorithm="grid", metric="val_mae", mode="min").mode == "min"


def test_strategy_auto_picks_ddp_for_a_function_and_says_why():
    plan = plan_job(JobSpec(entrypoint="train:main", code=CODE, strategy="auto"))
    assert plan.strategy == "ddp" and "training function" in plan.reason


def test_a_sweep_over_a_function_searches_its_config_and_lr():
    sweep = SweepSpec(
        base={"entrypoint": "train:main", "code": CODE, "epochs": 3},
        search_space={
            "config.hidden": {"type": "choice", "values": [8, 16]},
            "lr.base": {"type": "loguniform", "low": 1e-3, "high": 0.1},
        },
        scheduler={"type": "asha", "max_t": 3, "grace_period": 1},
    )
    trial = trial_spec(sweep.base, {"config.hidden": 16, "lr.base": 0.01})
    assert trial.entrypoint == "train:main" and trial.config == {"hidden": 16} and trial.lr.base == 0.01
    with pytest.raises(ValidationError, match="entrypoint is fixed"):
        SweepSpec(
            base={"entrypoint": "train:main", "code": CODE},
            search_space={"entrypoint": {"type": "choice", "values": ["train:main", "other:main"]}},
        )


def test_submitting_a_function_job(client):
    _, project = make_project(client, "fn")
    code_id = upload(client, project["member"], {"train.py": b"def main(ctx):\n    pass\n"})
    key = auth(project["member"])
    created = client.post("/v1/jobs", json={"entrypoint": "train:main", "code": {"id": code_id}}, headers=key)
    assert created.status_code == 201, created.text
    assert created.json()["workload"] == "train:main" and created.json()["spec"]["entrypoint"] == "train:main"
    both = client.post("/v1/jobs", json={"entrypoint": "train:main", "workload": "digits"}, headers=key)
    assert both.status_code == 422 and "exactly one of workload" in both.text
    # Without code, only from a package the operator allowed, as a custom workload.
    foreign = client.post("/v1/jobs", json={"entrypoint": "evil.pkg:main"}, headers=key)
    assert foreign.status_code == 422, foreign.text
    assert foreign.json()["detail"][0]["loc"][-1] == "entrypoint" and "not an allowed" in foreign.text


# --- the runner, on LocalContext -------------------------------------------------------------------------


def function_config(entrypoint: str = "train:main", world_size: int = 1, **fields) -> dict:
    spec = JobSpec(
        entrypoint=entrypoint,
        config={"hidden": 16, "samples": 256},
        scaling={"num_workers": world_size},
        batch={"per_worker": 32},
        lr={"base": 0.03, "base_batch": 32},
        **fields,
    )
    return loop_config(spec, TrainingPlan.fixed(spec))


@pytest.fixture
def example_code(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLE))  # the job's working directory on the cluster
    yield
    sys.modules.pop("train", None)
    sys.modules.pop("serve", None)


def reports(reporter: RecordingReporter) -> list[MetricsEvent]:
    """The metric points of the function's reports (not the last checkpoint's blocking, sent when main returned,
    with no values)."""
    return [e for e in reporter.events if isinstance(e, MetricsEvent) and e.values]


class Killed(Exception):
    pass


def killed_after_two_epochs(ctx: TrainContext) -> None:
    """The example's function, its worker killed right after the second epoch's checkpoint."""
    import train

    report = ctx.report

    def report_then_die(metrics, checkpoint_dir=None, **position):
        report(metrics, checkpoint_dir, **position)
        if ctx.epoch == 2:
            raise Killed

    ctx.report = report_then_die
    train.main(ctx)


def test_a_function_trains_reports_checkpoints_and_resumes_exactly(example_code, tmp_path):
    straight = LocalContext(tmp_path / "straight")
    reporter = RecordingReporter()
    result = run_function(function_config(epochs=4), straight, reporter)
    assert isinstance(reporter.events[0], StateEvent) and reporter.events[0].state == "running"
    metrics = reports(reporter)
    assert [(e.epoch, e.step) for e in metrics] == [(1, 1), (2, 2), (3, 3), (4, 4)]
    # The last checkpoint's blocking (goodput), once main returned: a point with no values at the last step.
    last = reporter.events[-1]
    assert (last.values, last.step) == ({}, 4) and last.checkpoint_blocked_s > 0
    assert metrics[-1].values["val_accuracy"] > 0.8 and result == {**metrics[-1].values, "epoch": 4, "step": 4}
    assert len(straight.checkpoints) == 4 and all(verify_checkpoint(c) for c in straight.checkpoints)
    final = straight.checkpoints[-1]
    assert (final / CONTEXT_FILE).is_file() and isinstance(
        torch.load(final / "model.pt", weights_only=False), torch.nn.Module
    )

    config = function_config(f"{__name__}:killed_after_two_epochs", epochs=4)
    killed = LocalContext(tmp_path / "resumed")
    with pytest.raises(Killed):
        run_function(config, killed, RecordingReporter())
    # Killed right after its second report returned: that checkpoint's asynchronous copy was already handed over
    # (as to Ray Train's upload thread); it lands whole, which is what is waited for here, not raced.
    killed.wait_committed({})
    survivor = latest_checkpoint(tmp_path / "resumed")
    assert survivor is not None and survivor.name.endswith("2")
    resumed_reporter = RecordingReporter()
    resumed = LocalContext(tmp_path / "resumed", resume_from=survivor)
    assert run_function(function_config(epochs=4), resumed, resumed_reporter) == result
    assert [(e.epoch, e.step) for e in reports(resumed_reporter)] == [(3, 3), (4, 4)]
    state = torch.load(resumed.checkpoints[-1] / "state.pt", weights_only=True)["model"]
    assert_same_state(torch.load(final / "state.pt", weights_only=True)["model"], state, atol=0)


class PreemptedAfter(LocalContext):
    """``LocalContext`` playing the control plane: ``should_preempt()`` is asked (on rank 0) after ``calls`` steps."""

    def __init__(self, *args, calls: int, **kwargs) -> None:
        self.calls, self.asked = calls, 0
        super().__init__(*args, **kwargs)

    @property
    def preempt_requested(self) -> bool:
        self.asked += 1
        return self.asked > self.calls

    @preempt_requested.setter
    def preempt_requested(self, value: bool) -> None:
        pass


def test_should_preempt_checkpoints_and_returns_preempted_and_the_resume_is_exact(example_code, tmp_path):
    """The example's main asks ctx.should_preempt() after every step (8 an epoch here). Asked in epoch 3's 4th
    step, it checkpoints there and returns: the result carries PREEMPTED_KEY (the driver exits PREEMPTED on it).
    The next attempt resumes mid-epoch and ends with the uninterrupted run's parameters and final metrics."""
    straight = LocalContext(tmp_path / "straight")
    expected = run_function(function_config(epochs=4), straight, RecordingReporter())
    assert PREEMPTED_KEY not in expected and straight.preempt_requested is False

    preempted = PreemptedAfter(tmp_path / "preempted", calls=2 * 8 + 3)
    reporter = RecordingReporter()
    result = run_function(function_config(epochs=4), preempted, reporter)
    assert result[PREEMPTED_KEY] == 3 and (result["epoch"], result["step"]) == (2, 3)
    assert [(e.epoch, e.step) for e in reports(reporter)] == [(1, 1), (2, 2), (2, 3)]
    assert preempted.asked == 2 * 8 + 4  # it stopped at the first step that was told: no step after it
    checkpoint = latest_checkpoint(tmp_path / "preempted")
    state = torch.load(checkpoint / "state.pt", weights_only=True)
    assert (state["epoch"], state["batches_done"]) == (2, 4) and verify_checkpoint(checkpoint)

    resumed = LocalContext(tmp_path / "preempted", resume_from=checkpoint)
    resumed_reporter = RecordingReporter()
    result = run_function(function_config(epochs=4), resumed, resumed_reporter)
    assert PREEMPTED_KEY not in result
    assert [(e.epoch, e.step) for e in reports(resumed_reporter)] == [(3, 4), (4, 5)]
    assert result == {**expected, "step": 5}  # the same final metrics; one report more (the preemption's)
    final = torch.load(resumed.checkpoints[-1] / "state.pt", weights_only=True)["model"]
    assert_same_state(torch.load(straight.checkpoints[-1] / "state.pt", weights_only=True)["model"], final, atol=0)


def test_should_preempt_is_false_without_a_control_plane_and_stays_true_once_told(tmp_path):
    ctx = bare_context(tmp_path)
    assert [ctx.should_preempt() for _ in range(3)] == [False, False, False]
    ctx._loop.preempt_requested = True
    assert ctx.should_preempt() and ctx.preempted
    ctx._loop.preempt_requested = False
    assert ctx.should_preempt()  # latched: main is on its way out
    ctx.close()


def bare_context(tmp_path: Path) -> TrainContext:
    config = function_config()
    spec, plan = JobSpec.model_validate(config["spec"]), TrainingPlan.model_validate(config["plan"])
    return TrainContext(spec, plan, LocalContext(tmp_path), RecordingReporter(), None)


def test_metric_names_and_values_are_checked(tmp_path):
    ctx = bare_context(tmp_path)
    ctx.report({"loss": torch.tensor(0.5), "acc": 1})
    assert ctx.result() == {"loss": 0.5, "acc": 1.0, "epoch": 0, "step": 1}
    for metrics, message in [
        ({"bad name": 1.0}, "no spaces"),
        ({"loss": "low"}, "report a number"),
        ({"loss": torch.ones(3)}, "3 elements"),
        ({"loss": float("nan")}, "finite"),
        ({f"m{i}": 0.0 for i in range(DEFAULT_MAX_METRIC_NAMES)}, f"at most {DEFAULT_MAX_METRIC_NAMES}"),
    ]:
        with pytest.raises(ValueError, match=message):
            ctx.report(metrics)


def ray_train_style(ctx: TrainContext) -> None:
    """How Ray Train's examples report: the position in the metrics dict (``train.report({"loss": l, "epoch":
    e})``), the epoch counted from 0 by ``for epoch in range(...)``, a checkpoint with every report; then one
    report with both ``epoch`` and ``step`` in the dict, no checkpoint."""
    for epoch in range(ctx.epochs):
        with tempfile.TemporaryDirectory() as folder:
            ctx.report({"loss": 1.0 / (epoch + 1), "epoch": epoch}, checkpoint_dir=folder)
    ctx.report({"loss": 0.1, "epoch": ctx.epochs - 1, "step": 10})


RAY_STYLE_POSITIONS = [(0, 1), (1, 2), (2, 3), (2, 10)]  # (epoch, step): the step counts reports unless given


def test_a_function_reporting_its_epoch_in_the_metrics_dict_runs_to_the_end(tmp_path):
    """Ray Train's idiom, ctx.report({"loss": l, "epoch": e}): the dict's epoch (and step) is the report's
    position, not a metric. Before, the first report failed the run: "'epoch' is not a metric name here"."""
    ctx = LocalContext(tmp_path)
    reporter = RecordingReporter()
    result = run_function(function_config(f"{__name__}:ray_train_style", epochs=3), ctx, reporter)
    metrics = [e for e in reports(reporter)]
    assert [(e.epoch, e.step) for e in metrics] == RAY_STYLE_POSITIONS
    # Each report's checkpoint blocked main for a moment; its seconds ride the next report (goodput).
    assert [bool(e.checkpoint_blocked_s) for e in metrics] == [False, True, True, True]
    assert [e.values for e in metrics] == [{"loss": 1.0}, {"loss": 0.5}, {"loss": 1 / 3}, {"loss": 0.1}]
    assert result == {"loss": 0.1, "epoch": 2, "step": 10}
    # What the checkpoints carry (Ray Train's report): the metric beside the position, once each.
    assert ctx.reported == [{"loss": 1.0 / (e + 1), "epoch": e, "step": e + 1} for e in range(3)]
    positions = [json.loads((c / CONTEXT_FILE).read_text()) for c in ctx.checkpoints]
    assert positions == [{"epoch": e, "step": e + 1} for e in range(3)]  # where a resume goes on from


def test_the_position_may_be_in_the_dict_or_the_keywords_but_not_two_different_ones(tmp_path):
    ctx = bare_context(tmp_path)
    ctx.report({"loss": 1.0}, epoch=1)  # the keywords, as before
    ctx.report({"loss": 0.9, "epoch": 1}, epoch=1)  # both, agreeing
    ctx.report({"loss": 0.8, "step": 7}, epoch=2)  # one in each
    ctx.report({"loss": 0.7, "epoch": torch.tensor(3)})  # a whole number in a one-element tensor
    assert ctx.result() == {"loss": 0.7, "epoch": 3, "step": 8}
    events = reports(ctx._reporter)
    assert [(e.epoch, e.step) for e in events] == [(1, 1), (1, 2), (2, 7), (3, 8)]
    assert all(set(e.values) == {"loss"} for e in events)
    for metrics, position, message in [
        ({"loss": 1.0, "epoch": 2}, {"epoch": 3}, r"epoch=3 and \{'epoch': 2\} in the metrics"),
        ({"loss": 1.0, "step": 5}, {"step": 4}, r"step=4 and \{'step': 5\} in the metrics"),
        ({"epoch": 1.5}, {}, "epoch is 1.5: a whole number"),
        ({"epoch": -1}, {}, "epoch is -1: a whole number from 0"),
        ({"step": "3"}, {}, "step is str: a whole number"),
        ({"step": True}, {}, "step is bool: a whole number"),
        ({"epoch": torch.ones(2)}, {}, "epoch is a tensor of 2 elements"),
        ({}, {"step": -2}, "step is -2"),
    ]:
        with pytest.raises(ValueError, match=message):
            ctx.report(metrics, **position)
    assert ctx.result() == {"loss": 0.7, "epoch": 3, "step": 8}  # a refused report changed nothing


def test_a_checkpoint_folder_is_each_ranks_own(tmp_path):
    ctx = bare_context(tmp_path / "root")
    folder = tmp_path / "shared"
    (folder / "manifests").mkdir(parents=True)
    (folder / "manifests" / "rank-00001.json").write_text("{}")
    with pytest.raises(ValueError, match="another rank's part"):
        ctx.report({"loss": 1.0}, checkpoint_dir=folder)
    with pytest.raises(ValueError, match="not a folder"):
        ctx.report({"loss": 1.0}, checkpoint_dir=tmp_path / "missing")


# --- two gloo ranks ---------------------------------------------------------------------------------------


def _two_ranks(root: str) -> dict:
    sys.path.insert(0, str(EXAMPLE))
    ctx = LocalContext(root)
    reporter = RecordingReporter()
    result = run_function(function_config(world_size=2, epochs=2), ctx, reporter)
    seen = []
    config = function_config(world_size=2)
    spec, plan = JobSpec.model_validate(config["spec"]), TrainingPlan.model_validate(config["plan"])
    train_ctx = TrainContext(spec, plan, ctx, None, None)
    loader = train_ctx.shard(torch.utils.data.TensorDataset(torch.arange(64)), batch_size=8)
    for _ in range(2):
        seen.append(sorted(int(i) for (batch,) in loader for i in batch))
    wrapped = type(train_ctx.prepare(torch.nn.Linear(2, 2))).__name__
    stages = [event.stage for event in reporter.events if event.type == "startup"]  # the start-up timeline's
    events = [event for event in reporter.events if event.type != "startup"]
    return {"result": result, "events": len(events), "stages": stages, "seen": seen, "wrapped": wrapped}


def _two_ranks_preempted(root: str) -> dict:
    """Only rank 0 is told (after 5 steps), as only rank 0 polls the control plane."""
    sys.path.insert(0, str(EXAMPLE))
    ctx = PreemptedAfter(root, calls=5) if dist.get_rank() == 0 else LocalContext(root)
    return run_function(function_config(world_size=2, epochs=2), ctx, RecordingReporter())


def test_on_two_ranks_should_preempt_is_true_on_both_at_the_same_step(tmp_path):
    """Rank 1 learns rank 0's answer one call later (the exchange runs in the background); both stop at the same
    step and their parts make one checkpoint of both ranks."""
    (rank0,), (rank1,) = run_on_ranks([(_two_ranks_preempted, {"root": str(tmp_path / "ckpt")})], tmp_path)
    # 256 samples, 32 a batch on each of 2 ranks: 4 steps an epoch. Rank 0 is told at its 6th call; both see it
    # at the 7th (epoch 2's 3rd step): the report after epoch 1's is the second, of 1 finished epoch.
    assert rank0[PREEMPTED_KEY] == rank1[PREEMPTED_KEY] == 2 and rank0["epoch"] == rank1["epoch"] == 1
    checkpoint = latest_checkpoint(tmp_path / "ckpt")
    state = torch.load(checkpoint / "state.pt", weights_only=True)
    assert (state["epoch"], state["batches_done"]) == (1, 3)
    verification = verify_checkpoint(checkpoint)
    assert verification and verification.world_size == 2


def _two_ranks_ray_train_style(root: str) -> dict:
    ctx = LocalContext(root)
    reporter = RecordingReporter()
    config = function_config(f"{__name__}:ray_train_style", world_size=2, epochs=3)
    result = run_function(config, ctx, reporter)
    metrics = [(e.epoch, e.step) for e in reports(reporter)]
    return {"result": result, "metrics": metrics, "reported": ctx.reported, "checkpoints": ctx.checkpoints}


def test_on_two_ranks_ddp_wraps_shards_are_disjoint_and_a_checkpoint_has_both_parts(tmp_path):
    """Also (in the same group, to spare a second one) Ray Train's idiom on two ranks: both run it to the end
    (before, both failed at the first report), only rank 0 sends metrics, and each checkpoint has both parts."""
    tasks = [
        (_two_ranks, {"root": str(tmp_path / "ckpt")}),
        (_two_ranks_ray_train_style, {"root": str(tmp_path / "ray")}),
    ]
    ranks = run_on_ranks(tasks, tmp_path)
    (rank0, ray0), (rank1, ray1) = ranks
    assert ray0["result"] == ray1["result"] == {"loss": 0.1, "epoch": 2, "step": 10}
    assert ray0["metrics"] == RAY_STYLE_POSITIONS and ray1["metrics"] == []
    assert (
        ray0["reported"] == ray1["reported"] == [{"loss": 1.0 / (e + 1), "epoch": e, "step": e + 1} for e in range(3)]
    )
    assert [verify_checkpoint(c).world_size for c in ray0["checkpoints"]] == [2, 2, 2]
    assert rank0["wrapped"] == rank1["wrapped"] == "DistributedDataParallel"
    for epoch in range(2):  # disjoint, together the whole set, reshuffled per epoch
        assert sorted(rank0["seen"][epoch] + rank1["seen"][epoch]) == list(range(64))
    assert rank0["seen"][0] != rank0["seen"][1]
    # running, 2 epochs and the last checkpoint's blocking, from rank 0 only
    assert rank0["events"] == 4 and rank1["events"] == 0
    assert rank0["stages"] == ["training_started", "first_step"] and rank1["stages"] == []
    assert rank0["result"]["epoch"] == 2
    checkpoint = latest_checkpoint(tmp_path / "ckpt")
    verification = verify_checkpoint(checkpoint)
    assert verification and verification.world_size == 2
    shutil.rmtree(tmp_path / "ckpt")


SLOW_FORWARD_S = 0.03  # rank 1's extra time in each forward pass


class SlowOnRankOne(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if dist.get_rank() == 1:
            time.sleep(SLOW_FORWARD_S)
        return self.linear(x)


def slow_rank_one(ctx: TrainContext) -> None:
    """A plain DDP loop with no timing code: rank 1's forward passes are slow, every rank waits for it in the
    backward pass's all-reduce. Rank 0 alone reports, every 4 steps."""
    model = ctx.prepare(SlowOnRankOne())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.utils.data.TensorDataset(torch.randn(256, 4), torch.randn(256, 1))
    for step, (x, y) in enumerate(ctx.shard(data, batch_size=8), start=1):
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 4 == 0 and ctx.rank == 0:
            ctx.report({"loss": loss.item()})


def _two_ranks_one_slow(root: str) -> dict:
    from workers.runtime import stragglers

    stragglers.PUBLISH_EVERY_S = 0.0  # every forward: rank 1 has published step k before rank 0's report of it
    reporter = RecordingReporter()
    run_function(function_config(f"{__name__}:slow_rank_one", world_size=2, epochs=1), LocalContext(root), reporter)
    return [e.rank_step_s for e in reports(reporter)]


def test_a_functions_slow_rank_is_timed_with_no_code_of_its_own(tmp_path):
    """Stragglers in training functions: ``ctx.prepare``'s model times its training forwards and ``ctx.shard``'s
    loader the waits for batches on every rank; rank 0's reports carry every rank's seconds per step, though
    only rank 0 reports and DDP makes every rank's step as long as the slowest's."""
    (rank0,), (rank1,) = run_on_ranks([(_two_ranks_one_slow, {"root": str(tmp_path / "ckpt")})], tmp_path)
    assert rank1 == []  # only rank 0 reports
    assert len(rank0) == 4  # 256 samples, 8 a batch on each of 2 ranks: 16 steps, a report every 4
    for fast, slow in rank0:
        assert slow >= SLOW_FORWARD_S * 0.9 and slow > 3 * fast, rank0


class DictStore:
    """The few calls of torch's Store that ``FunctionOwnTime`` makes."""

    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}

    def set(self, key: str, value: str) -> None:
        self.values[key] = value.encode()

    def check(self, keys: list[str]) -> bool:
        return all(key in self.values for key in keys)

    def get(self, key: str) -> bytes:
        return self.values[key]


def test_a_straggler_window_waits_until_every_rank_has_published_steps_of_it():
    from workers.runtime.stragglers import STORE_KEY, FunctionOwnTime

    store = DictStore()
    rank0 = FunctionOwnTime(torch.device("cpu"), 0, 2, store=store)
    rank0.steps = 4
    assert rank0.gather() is None  # rank 1 has published nothing yet
    store.set(STORE_KEY.format(rank=1), "2.0 4")
    rank0.own.host_s, rank0.steps = 0.4, 8
    assert rank0.gather() == pytest.approx([0.05, 0.5])  # since the start: 0.4 s / 8 steps, 2 s / 4 steps
    rank0.own.host_s, rank0.steps = 0.2, 12
    assert rank0.gather() is None  # rank 1 has not stepped since: the window goes on
    store.set(STORE_KEY.format(rank=1), "4.0 8")
    rank0.own.host_s, rank0.steps = 0.2, 16
    assert rank0.gather() == pytest.approx([0.05, 0.5])  # 0.4 s over 8 steps; 2 s over 4


# --- serving a function's model (over the fake Serve of tests/unit/test_deployments.py) --------------------


@pytest.fixture
def settings_overrides() -> dict:
    return {"serve_port": 8123, "workload_packages": ""}


def function_job(app, client, tmp_path: Path, files: dict[str, bytes]) -> tuple[str, str]:
    """A finished training function's job (checkpoints with val_accuracy 0.80, 0.95, 0.90) whose code is
    ``files``; returns the job id and the code id."""
    code_id = upload(client, ADMIN, files)
    job_id, _ = finished_job(app, tmp_path)
    with app.state.service.sessions.begin() as session:
        job = session.get(Job, job_id)
        job.spec = {**job.spec, "workload": None, "config": {}, "entrypoint": "train:main", "code": {"id": code_id}}
        job.workload = "train:main"
    return job_id, code_id


def test_a_functions_model_is_served_by_its_serve_py_from_its_code(app, client, backend, tmp_path):
    job_id, code_id = function_job(app, client, tmp_path, {"train.py": b"", "serve.py": b"def predict(m, p): ..."})
    no_metric = deploy(client, name="fn", source={"job_id": job_id})
    assert no_metric.status_code == 422 and "give source.metric" in no_metric.text
    assert no_metric.json()["detail"][0]["loc"][-1] == "metric"
    lowest = deploy(client, name="fn", source={"job_id": job_id, "metric": "val_accuracy", "mode": "min"})
    assert lowest.status_code == 201, lowest.text
    target = lowest.json()["target"]
    assert target["checkpoint"]["metrics"] == {"val_accuracy": 0.80}  # by the source's own metric and mode
    assert target["checkpoint"]["code"] == {"id": code_id, "entrypoint": "train:main"}
    assert deploy(client, name="fn2", source={"job_id": job_id, "select": "latest"}).status_code == 201

    reconcile(app)
    served = app_of(backend, "fn")
    (mount,) = backend.packages  # uploaded to Ray (again): Ray drops a package no running job holds
    assert mount.startswith("gcs://_ray_pkg_") and served["runtime_env"] == {"working_dir": mount}
    assert served["args"]["serve_hook"] is True


def test_a_function_without_serve_py_is_a_422_saying_what_is_missing(app, client, tmp_path):
    job_id, _ = function_job(app, client, tmp_path, {"train.py": b""})
    response = deploy(client, name="fn", source={"job_id": job_id, "select": "latest"})
    assert response.status_code == 422, response.text
    assert "serve.py" in response.text and "predict(model, payload)" in response.text and "model.pt" in response.text


def test_the_replica_loads_model_pt_and_answers_through_serve_py(example_code, tmp_path):
    from workers.serve.app import load_hook_predictor
    from workers.serve.predictors import BadInput

    run_function(function_config(epochs=2), LocalContext(tmp_path), RecordingReporter())
    checkpoint = latest_checkpoint(tmp_path)
    predictor = load_hook_predictor(str(checkpoint))  # `serve` imported from the working directory
    predictor.probe()
    answer = predictor.predict([predictor.parse({"points": [[0.0, 0.0], [1.9, 1.9]]})])[0]
    assert answer == {"inside": [True, False]}
    with pytest.raises(BadInput, match="two numbers"):
        predictor.parse({"points": [[1, 2, 3]]})
    (checkpoint / "model.pt").unlink()
    with pytest.raises(ValueError, match="has no model.pt"):
        load_hook_predictor(str(checkpoint))
