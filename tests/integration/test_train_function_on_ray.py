"""Training functions end to end (docs/code.md, "Training functions"): the example examples/own_code/train_function, a
directory no node has installed, uploaded with POST /v1/code, runs its own loop (``"entrypoint": "train:main"``,
reporting its epoch in the metrics dict as Ray Train's users do) as a 2-worker DDP job; and a function that prints its
environment shows that no control-plane secret reaches a worker."""

from __future__ import annotations

import io
import json
import re
import time
import zipfile
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import ADMIN, TERMINAL, key_headers, remove_serving

pytestmark = pytest.mark.integration

EXAMPLE = Path(__file__).parents[2] / "examples" / "own_code" / "train_function"
DEPLOYMENT = "circle-function"
DUMP_ENV = """
import json
import os
import tempfile


def main(ctx):
    # Into the run's checkpoint, each rank its own file: a worker's printed lines reach the job's logs through
    # the driver, and a driver that ends first drops them.
    with tempfile.TemporaryDirectory() as folder:
        with open(os.path.join(folder, f"env-rank-{ctx.rank}.json"), "w") as out:
            json.dump(dict(os.environ), out)
        ctx.report({"done": 1.0}, checkpoint_dir=folder)
"""


def zip_folder(folder: Path) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for path in sorted(folder.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                archive.write(path, path.relative_to(folder).as_posix())
    return buffer.getvalue()


def upload(member, files: bytes) -> str:
    response = member.http.post("/v1/code", files={"file": ("code.zip", files)})
    assert response.status_code in (200, 201), response.text
    return response.json()["id"]


def test_the_example_function_trains_two_workers_is_deployed_and_answers(member, ray_cluster):
    code_id = upload(member, zip_folder(EXAMPLE))
    spec = json.loads((EXAMPLE / "job.json").read_text())
    spec["code"] = {"id": code_id}
    response = member.http.post("/v1/jobs", json=spec)
    assert response.status_code == 201, response.text
    job_id = response.json()["id"]
    job = member.wait(job_id, {"SUCCEEDED"}, timeout_s=240)

    assert job["workload"] == "train:main" and job["plan"]["strategy"] == "ddp"
    result = job["result"]["metrics"]
    assert result["epoch"] == spec["epochs"] and result["val_accuracy"] > 0.9, job["result"]
    metrics = member.http.get(f"/v1/jobs/{job_id}/metrics").json()
    # The example reports {..., "epoch": e} as Ray Train's users write it: the position, not a metric; its step
    # counts the reports.
    assert [(m["epoch"], m["step"]) for m in metrics] == [(e, e) for e in range(1, spec["epochs"] + 1)]
    assert all({"train_loss", "val_accuracy"} <= m["values"].keys() for m in metrics)
    assert not any({"epoch", "step"} & m["values"].keys() for m in metrics)
    checkpoints = member.http.get(f"/v1/jobs/{job_id}/checkpoints").json()
    assert checkpoints and (checkpoints[-1]["epoch"], checkpoints[-1]["step"]) == (spec["epochs"], spec["epochs"])
    assert checkpoints[-1]["metrics"]["val_accuracy"] == result["val_accuracy"]
    assert job["result"]["checkpoint_path"] == checkpoints[-1]["path"]
    folder = Path(checkpoints[-1]["path"])
    assert (folder / "model.pt").is_file() and (folder / "state.pt").is_file()
    assert sorted(p.name for p in (folder / "manifests").iterdir()) == ["rank-00000.json", "rank-00001.json"]

    # Served by its own serve.py, in a replica whose working directory is the job's code package.
    source = {"job_id": job_id, "metric": "val_accuracy"}
    try:
        created = member.http.post("/v1/deployments", json={"name": DEPLOYMENT, "source": source})
        assert created.status_code == 201, created.text
        deployment = member.wait_deployment(DEPLOYMENT, {"HEALTHY"}, timeout_s=180)
        url, key = deployment["url"], key_headers(member)
        answer = httpx.post(url, json={"points": [[0.0, 0.0], [0.3, -0.2], [1.9, 1.9], [-1.8, 1.7]]}, headers=key)
        assert answer.status_code == 200, answer.text
        assert answer.json()["inside"] == [True, True, False, False]
        refused = httpx.post(url, json={"points": [[1.0]]}, headers=key)
        assert refused.status_code == 422 and "two numbers" in refused.json()["detail"]
    finally:
        remove_serving(member, ray_cluster, DEPLOYMENT)


def worker_environments(member, job_id: str) -> list[dict]:
    """Each rank's environment, from the files its run wrote into its checkpoint (local storage here)."""
    (checkpoint,) = member.http.get(f"/v1/jobs/{job_id}/checkpoints").json()
    folder = Path(checkpoint["path"])
    return [json.loads((folder / f"env-rank-{rank}.json").read_text()) for rank in (0, 1)]


def ray_jobs_of(ray_cluster, job_ids) -> list[dict]:
    """What Ray lists of these jobs' attempts to anyone holding the cluster's Ray token (every process on it)."""
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(ray_cluster.dashboard_url, headers={"Authorization": f"Bearer {ray_cluster.token()}"})
    return [
        {
            "submission_id": j.submission_id,
            "entrypoint": j.entrypoint,
            "runtime_env": j.runtime_env,
            "metadata": j.metadata,
        }
        for j in client.list_jobs()
        if (j.metadata or {}).get("job_id") in job_ids
    ]


def test_no_control_plane_secret_reaches_a_worker(member, ray_cluster):
    code_id = upload(member, _zip({"dump_env.py": DUMP_ENV}))
    spec = {"entrypoint": "dump_env:main", "code": {"id": code_id}, "scaling": {"num_workers": 2}}
    first = member.http.post("/v1/jobs", json={**spec, "name": "first"}).json()["id"]
    second = member.http.post("/v1/jobs", json={**spec, "name": "second"}).json()["id"]
    # Ray's listing while the attempts start and run, then once they ended
    # (docs/security.md, "Run tokens are never in Ray's job table")
    listed = []
    deadline = time.monotonic() + 180
    while any(member.job(j)["state"] not in TERMINAL for j in (first, second)):
        assert time.monotonic() < deadline, [member.job(j)["state"] for j in (first, second)]
        listed += ray_jobs_of(ray_cluster, {first, second})
        time.sleep(0.5)
    for job_id in (first, second):
        assert member.job(job_id)["state"] == "SUCCEEDED", member.job(job_id)
    listed += ray_jobs_of(ray_cluster, {first, second})
    environments = {job_id: worker_environments(member, job_id) for job_id in (first, second)}

    # Ray's job table holds no run token, and the claim code it holds was worth nothing once the driver claimed.
    assert {j["submission_id"] for j in listed} == {f"{first}-1", f"{second}-1"}
    assert not re.search(r"jtk_", json.dumps(listed))
    for job_id in (first, second):
        (code,) = {
            j["runtime_env"]["env_vars"]["ORCHESTRATOR_CLAIM_CODE"] for j in listed if j["metadata"]["job_id"] == job_id
        }
        claim = member.http.post(
            f"/internal/v1/jobs/{job_id}/claim",
            json={"attempt": 1, "nonce": "read-from-rays-job-table"},
            headers={"Authorization": f"Bearer {code}"},
        )
        assert claim.status_code == 401, claim.text
        for route in ("assignment", "control"):
            answer = member.http.get(
                f"/internal/v1/jobs/{job_id}/{route}",
                params={"attempt": 1},
                headers={"Authorization": f"Bearer {code}"},
            )
            assert answer.status_code == 401, (route, answer.text)

    member_key = member.http.headers["Authorization"].removeprefix("Bearer ")
    for job_id, envs in environments.items():
        other = second if job_id == first else first
        (other_code,) = {env["ORCHESTRATOR_CLAIM_CODE"] for env in environments[other]}
        for env in envs:
            text = json.dumps(env)
            assert env["ORCHESTRATOR_CLAIM_CODE"] != other_code and other_code not in text
            assert ADMIN not in text and member_key not in text
            assert "orchestrator.db" not in text and "sqlite://" not in text  # the service's database URL
            assert not any(name in env for name in ("ORCHESTRATOR_ADMIN_TOKEN", "ORCHESTRATOR_DATABASE_URL"))
            # Where to report, the attempt's claim code (exchanged by the driver at its start), and how often the
            # ranks ask what the control plane wants (a preemption, their stacks): nothing else. No run token is in a
            # worker's environment: the ranks get it from the driver, in Train's loop config.
            assert {k for k in env if k.startswith("ORCHESTRATOR_")} <= {
                "ORCHESTRATOR_URL",
                "ORCHESTRATOR_CLAIM_CODE",
                "ORCHESTRATOR_CONTROL_POLL_S",
                "ORCHESTRATOR_STACKS_POLL_S",
            }
            assert not re.findall(r"jtk_[\w-]+", text)


def _zip(files: dict[str, str]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return buffer.getvalue()


# The example's function asks ctx.should_preempt() after every step: 16 steps an epoch, 2 workers of 1 CPU (the
# whole cluster), EPOCHS long enough that it still trains when the preemption reaches it (an epoch took about
# 0.9 s here, the preemption 2-3 s from the high job's submit).
EPOCHS = 12
FUNCTION = {"config": {"hidden": 32, "samples": 1024}, "scaling": {"num_workers": 2}, "epochs": EPOCHS, "seed": 3}


def test_a_preempted_training_function_checkpoints_via_should_preempt_and_resumes(member):
    """A priority-0 training function holds both CPUs; the same function at priority 10 preempts it. Its main
    sees ctx.should_preempt(), checkpoints mid-epoch and returns: the driver exits PREEMPTED, the job is requeued
    ("checkpointed and stopped", not failed, not retried), and its next attempt resumes mid-epoch and ends with
    the final metrics of the high-priority run, which is the same spec uninterrupted."""
    code_id = upload(member, zip_folder(EXAMPLE))
    spec = {"entrypoint": "train:main", "code": {"id": code_id}, **FUNCTION, "retries": {"max_attempts": 1}}
    low_id = member.http.post("/v1/jobs", json={**spec, "name": "fn-low", "priority": 0}).json()["id"]
    deadline = time.monotonic() + 180
    while ((low := member.job(low_id)).get("latest_metrics") or {}).get("epoch", 0) < 1:
        if low["state"] in TERMINAL or time.monotonic() > deadline:
            pytest.fail(f"the low job is {low['state']} ({low['reason']}: {low['message'][-2000:]})")
        time.sleep(0.2)
    high_id = member.http.post("/v1/jobs", json={**spec, "name": "fn-high", "priority": 10}).json()["id"]

    low_done = member.wait(low_id, {"SUCCEEDED"}, timeout_s=300)
    high_done = member.wait(high_id, {"SUCCEEDED"}, timeout_s=60)
    events = member.http.get(f"/v1/jobs/{low_id}/events").json()
    requeued = [e for e in events if e["to_state"] == "QUEUED" and e["from_state"] is not None]
    assert len(requeued) == 1 and requeued[0]["reason"] == "preempted", events
    assert high_id in requeued[0]["message"] and "checkpointed and stopped" in requeued[0]["message"], requeued
    assert not [e for e in events if e["to_state"] in ("FAILED", "RESTARTING")], events
    assert (low_done["attempt"], low_done["preemptions"]) == (2, 1), low_done

    # Attempt 1: epochs 1..k, then the preemption's report (k finished epochs, mid-epoch); attempt 2: k+1..EPOCHS.
    epochs: dict[int, list[int]] = {}
    for point in member.http.get(f"/v1/jobs/{low_id}/metrics").json():
        epochs.setdefault(point["attempt"], []).append(point["epoch"])
    first, second = epochs[1], epochs[2]
    k = first[-1]
    assert first == [*range(1, k + 1), k] and second == list(range(k + 1, EPOCHS + 1)), epochs
    final, reference = low_done["result"]["metrics"], high_done["result"]["metrics"]
    assert final["epoch"] == reference["epoch"] == EPOCHS
    assert abs(final["val_accuracy"] - reference["val_accuracy"]) <= 0.003, (final, reference)
    assert abs(final["train_loss"] - reference["train_loss"]) <= 0.001 * reference["train_loss"], (final, reference)
