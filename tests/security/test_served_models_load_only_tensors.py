"""A served model is loaded from tensors only, never by unpickling what storage holds (docs/security.md,
"Served models load tensors only").

Storage is writable from the cluster, so any file in a run's checkpoint folder may have been planted there
by another project's code. What each test showed on the old code (HEAD 5169c62):

- ``test_a_planted_dcp_metadata_never_runs_in_the_replica``: a Serve replica given an FSDP checkpoint
  without ``model.pt`` converted its shards with ``dcp_to_torch_save``, which reads ``sharded/.metadata``
  with ``pickle``: the planted payload ran (``AssertionError: the replica unpickled the planted .metadata``).
- ``test_a_planted_model_pt_is_refused_as_not_tensors``: the workload path already loaded ``model.pt`` with
  ``weights_only=True`` (no marker), but refused it with torch's bare ``UnpicklingError`` advising
  ``weights_only=False``; now a ValueError says serving loads only tensors, and what torch refused.
- ``test_the_conversion_command_never_runs_a_planted_metadata``: there was no way to make such a checkpoint
  servable but the replica's own conversion (``ModuleNotFoundError: workers.train.export_full``).
- ``test_resuming_training_never_runs_a_planted_dcp_metadata``: resuming an FSDP run read ``.metadata`` with
  DCP's ``pickle.load`` in the training job (``AssertionError: resuming unpickled the planted .metadata``).
- ``test_deploying_a_shards_only_checkpoint_is_a_422_saying_how_to_make_it_servable``: the control plane
  accepted it (``assert 201 == 422``, SQLite and PostgreSQL) and left the replica to convert it.

Now every FSDP checkpoint carries ``model.pt``, gathered by the training run at save time; the replica
loads only ``model.pt`` with ``torch.load(weights_only=True)`` and refuses a shards-only checkpoint without
opening ``sharded/``; the operator's ``python -m workers.train.export_full`` and the training runtime's resume
read ``.metadata`` with an unpickler that builds only DCP's metadata classes.

The replica's loader is called without Ray (as ``tests/unit/test_serving_app.py`` does); the control plane
runs over the unit tests' app with a fake cluster.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from tests.unit.api_helpers import auth, make_project
from tests.unit.test_deployments import finished_job
from workers.serve.app import ModelServer
from workers.workloads import digits

DIGITS_CONFIG = {"hidden": 16, "batchnorm": False, "val_fraction": 0.2}


def plant_marker(path: str) -> None:
    """What a planted pickle runs when it is loaded: leaves a file behind."""
    Path(path).write_text("the payload ran")


class Planted:
    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return plant_marker, (self.marker,)


def sharded_checkpoint(folder: Path) -> Path:
    """A checkpoint as an FSDP run saved it before this change: its model only in ``sharded/`` (DCP)."""
    torch.manual_seed(0)
    model = digits.build(DIGITS_CONFIG, 0).model
    dcp.save({"model": model.state_dict(), "optimizer": {}}, checkpoint_id=folder / "sharded")  # no process group
    return folder


def test_a_planted_dcp_metadata_never_runs_in_the_replica(tmp_path):
    folder = sharded_checkpoint(tmp_path / "checkpoint_000004")
    marker = tmp_path / "marker"
    (folder / "sharded" / ".metadata").write_bytes(pickle.dumps(Planted(marker)))

    with pytest.raises(BaseException) as refused:  # checked below, after the marker (DCP raises BaseException)
        ModelServer.func_or_class(str(folder), "digits", DIGITS_CONFIG)
    assert not marker.exists(), "the replica unpickled the planted .metadata"
    assert isinstance(refused.value, ValueError), refused.value
    assert "only FSDP shards" in str(refused.value) and "python -m workers.train.export_full" in str(refused.value)


def test_a_planted_model_pt_is_refused_as_not_tensors(tmp_path):
    folder = tmp_path / "checkpoint_000005"
    folder.mkdir()
    marker = tmp_path / "marker"
    (folder / "model.pt").write_bytes(pickle.dumps(Planted(marker)))

    with pytest.raises(BaseException) as refused:  # checked below, after the marker (DCP raises BaseException)
        ModelServer.func_or_class(str(folder), "digits", DIGITS_CONFIG)
    assert not marker.exists(), "the replica unpickled the planted model.pt"
    assert isinstance(refused.value, ValueError), refused.value
    assert "model.pt is not a state dict of tensors" in str(refused.value) and "weights_only" in str(refused.value)


def test_the_conversion_command_never_runs_a_planted_metadata(tmp_path):
    from workers.train.export_full import export_full_model

    folder = sharded_checkpoint(tmp_path / "checkpoint_000006")
    marker = tmp_path / "marker"
    (folder / "sharded" / ".metadata").write_bytes(pickle.dumps(Planted(marker)))

    with pytest.raises(ValueError, match="not DCP checkpoint metadata"):
        export_full_model(str(folder))
    assert not marker.exists(), "the conversion unpickled the planted .metadata"
    assert not (folder / "model.pt").exists()


def test_resuming_training_never_runs_a_planted_dcp_metadata(tmp_path):
    """The same file in a checkpoint a run resumes from: DCP's own reader would unpickle it in the training
    job (which holds its run's token); the runtime reads it with the same restricted unpickler."""
    from workers.runtime.checkpoint_io import TRAIN_STATE_FILE, restore_checkpoint
    from workers.runtime.step import TrainState

    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
    state = TrainState(model, optimizer, scheduler, torch.amp.GradScaler("cpu", enabled=False))
    folder = tmp_path / "checkpoint_000007"
    (folder / "sharded").mkdir(parents=True)
    position = {"epoch": 1, "epoch_steps": 1, "step": 1}
    train_state = {"strategy": "fsdp", **position, "scheduler": scheduler.state_dict(), "scaler": {}}
    torch.save(train_state, folder / TRAIN_STATE_FILE)
    marker = tmp_path / "marker"
    (folder / "sharded" / ".metadata").write_bytes(pickle.dumps(Planted(marker)))

    with pytest.raises(BaseException) as refused:  # checked below, after the marker (DCP raises BaseException)
        restore_checkpoint(folder, rank=0, strategy="fsdp", state=state)
    assert not marker.exists(), "resuming unpickled the planted .metadata"
    assert "not DCP checkpoint metadata" in str(refused.value)


def test_deploying_a_shards_only_checkpoint_is_a_422_saying_how_to_make_it_servable(app, client, tmp_path):
    project, keys = make_project(client, "served")
    job_id, checkpoint_ids = finished_job(app, tmp_path, project_id=project, accuracies=(0.9,))
    (folder,) = (tmp_path / f"run-{job_id}").iterdir()
    (folder / "model.pt").unlink()
    sharded_checkpoint(folder)

    response = client.post(
        "/v1/deployments",
        json={"name": "old-fsdp", "source": {"checkpoint_id": checkpoint_ids[0]}},
        headers=auth(keys["member"]),
    )
    assert response.status_code == 422, response.text
    detail = response.text
    assert "only FSDP shards" in detail and "python -m workers.train.export_full" in detail
