"""Uploaded code end to end (docs/code.md): a directory no node has installed, uploaded with POST /v1/code,
runs as a 2-worker DDP job through its own "module:function" workload (Ray's working_dir, from the stored package)."""

from __future__ import annotations

import io
import zipfile

import pytest

pytestmark = pytest.mark.integration

# A workload module no Ray node has: importable only from the job's working directory.
TRAIN_BLOBS = '''
"""Two Gaussian blobs, generated from the seed, and a small MLP: the same Workload shape as
examples/example_workloads/spirals.py."""

import torch
from torch import nn
from torch.utils.data import TensorDataset

from blobs_lib.data import make_blobs
from workers.workloads.base import Workload


def build(config, seed):
    points = int(config.get("points", 800))
    generator = torch.Generator().manual_seed(seed)
    x, y = make_blobs(points, generator)
    order = torch.randperm(points, generator=generator)
    val, train = order[: points // 5], order[points // 5 :]
    model = nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 2))
    return Workload(
        model=model,
        train_dataset=TensorDataset(x[train], y[train]),
        val_dataset=TensorDataset(x[val], y[val]),
    )
'''

BLOBS_DATA = """
import torch


def make_blobs(points, generator):
    labels = torch.arange(points) % 2
    centres = torch.tensor([[-1.0, -1.0], [1.0, 1.0]])
    return centres[labels] + 0.4 * torch.randn(points, 2, generator=generator), labels
"""


def _package() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:  # zipped with its folder, as `zip -r code.zip mycode` does
        archive.writestr("mycode/train_blobs.py", TRAIN_BLOBS)
        archive.writestr("mycode/blobs_lib/__init__.py", "")
        archive.writestr("mycode/blobs_lib/data.py", BLOBS_DATA)
    return buffer.getvalue()


def test_uploaded_code_trains_a_two_worker_job(member):
    uploaded = member.http.post("/v1/code", files={"file": ("mycode.zip", _package())})
    assert uploaded.status_code == 201, uploaded.text
    code_id = uploaded.json()["id"]
    assert uploaded.json()["files"] == 3
    files = {f["path"] for f in member.http.get(f"/v1/code/{code_id}").json()["file_list"]}
    assert files == {"train_blobs.py", "blobs_lib/__init__.py", "blobs_lib/data.py"}

    response = member.submit(
        name="own-code",
        workload="train_blobs:build",
        code={"id": code_id},
        config={"points": 800},
        epochs=5,
        scaling={"num_workers": 2},
        lr={"base": 0.1},
    )
    assert response.status_code == 201, response.text
    job = member.wait(response.json()["id"], {"SUCCEEDED"}, timeout_s=300)
    assert job["result"]["metrics"]["val_accuracy"] > 0.9, job["result"]  # two well-separated blobs

    package = member.http.get(f"/v1/code/{code_id}").json()
    assert package["last_used_at"] > package["created_at"]


# A package whose build fails inside the user's own helper, at a line the test knows.
TRAIN_BROKEN = """
def check_config(config):
    raise ValueError("mycode: points must be even, got " + str(config["points"]))


def build(config, seed):
    check_config(config)
"""


def _upload(member, files: dict[str, str]) -> str:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)
    uploaded = member.http.post("/v1/code", files={"file": ("code.zip", buffer.getvalue())})
    assert uploaded.status_code in (200, 201), uploaded.text
    return uploaded.json()["id"]


def _run_to_the_end(member, workload: str, code_id: str) -> dict:
    response = member.submit(
        name="code-error",
        workload=workload,
        code={"id": code_id},
        config={"points": 7},
        epochs=1,
        scaling={"num_workers": 1},
        retries={"max_worker_restarts": 2},
    )
    assert response.status_code == 201, response.text
    return member.wait(response.json()["id"], {"FAILED"}, timeout_s=240)


def test_an_exception_in_the_uploaded_code_fails_the_job_as_code_error_with_its_traceback(member):
    code_id = _upload(member, {"train_broken.py": TRAIN_BROKEN})
    job = _run_to_the_end(member, "train_broken:build", code_id)
    message = job["message"]
    assert job["reason"] == "code_error", message[-3000:]
    assert message.startswith("your code raised an exception at "), message[:500]
    assert "train_broken.py, line 3, in check_config" in message.splitlines()[0]
    # The worker's traceback, with the user's file and line.
    assert 'train_broken.py", line 3, in check_config' in message and "Traceback" in message
    assert "ValueError: mycode: points must be even, got 7" in message
    events = member.http.get(f"/v1/jobs/{job['id']}/events").json()
    assert not [e for e in events if e["to_state"] == "RESTARTING"]  # retry_app_errors is off


def test_a_function_the_package_lacks_fails_the_job_as_code_error_naming_it(member):
    code_id = _upload(member, {"train_broken.py": TRAIN_BROKEN})
    job = _run_to_the_end(member, "train_broken:fit", code_id)
    assert job["reason"] == "code_error", job["message"][-3000:]
    assert job["message"].startswith("the workload 'train_broken:fit' could not be loaded from your code")
    assert "'train_broken' has no function 'fit'" in job["message"]
