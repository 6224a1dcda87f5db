"""``orch`` (the real console script, in a subprocess) against the real service on the session's Ray cluster:
``jobs submit --follow`` to SUCCEEDED (exit 0), a failing workload (1), a cancel while following (3), Ctrl-C
(130, the job goes on) and ``--timeout`` (124), after which the job's deadline (``max_runtime_s``) stops it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ORCH = str(Path(sys.executable).parent / "orch")
FAULTY = "example_workloads.faulty:build"


@pytest.fixture(scope="module")
def env(service, member) -> dict[str, str]:
    """orch's environment: the service and the member's key (no config file)."""
    token = member.http.headers["Authorization"].split(" ", 1)[1]
    return {**os.environ, "ORCHESTRATOR_URL": service, "ORCHESTRATOR_TOKEN": token, "ORCHESTRATOR_PROFILE": ""}


def _spec(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    return path


def _orch(env, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([ORCH, *args], env=env, capture_output=True, text=True, timeout=timeout)


def _default_ctrl_c() -> None:
    # A test run started in the background of a shell inherits SIGINT ignored, and Python then never raises
    # KeyboardInterrupt: orch gets Ctrl-C as it would in a terminal.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _popen(env, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [ORCH, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_default_ctrl_c
    )


def _job_named(member, name: str, timeout_s: float = 30) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        jobs = member.http.get("/v1/jobs", params={"name_prefix": name}).json()["items"]
        if jobs:
            return jobs[0]
        time.sleep(0.2)
    pytest.fail(f"no job named {name}")


DIGITS = """\
name: {name}
workload: digits
epochs: 2
scaling:
  num_workers: 2
config:
  hidden: 32
"""


def test_submit_follow_to_succeeded_exits_0_with_progress_and_the_loops_lines(env, member, tmp_path):
    result = _orch(env, "jobs", "submit", "-f", str(_spec(tmp_path, DIGITS.format(name="cli-ok"))), "--follow")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    job = _job_named(member, "cli-ok")
    out = result.stdout
    assert "==> QUEUED -> STARTING" in out and "-> RUNNING" in out and "==> RUNNING -> SUCCEEDED" in out
    assert "epoch 2/2 step 44: train_loss" in out  # the training loop's own lines
    assert f"job {job['id']} attempt 1" in out  # the driver's
    final = next(line for line in out.splitlines() if line.startswith(f"==> job {job['id']} SUCCEEDED"))
    assert "val_accuracy=0.9" in final and "epoch=" not in final
    assert "\x1b[" not in out  # no colour, no live display in a pipe (and Ray's escape codes stripped)
    assert "Reporting training result" not in out and "Checkpoint successfully created" not in out  # quiet chatter

    # one rank's lines: rank 1's start line, and none of rank 0's per-epoch lines or the driver's
    rank_1 = _orch(env, "jobs", "logs", "cli-ok", "--rank", "1")
    assert rank_1.returncode == 0, rank_1.stderr
    assert "[rank 1/2] training worker started" in rank_1.stdout
    assert "[rank 0/2]" not in rank_1.stdout and "epoch 2/2 step" not in rank_1.stdout
    assert "epoch 2/2 step 44" in _orch(env, "jobs", "logs", "cli-ok", "--rank", "0").stdout


def test_a_failing_workload_exits_1_with_its_reason(env, member, tmp_path):
    spec = _spec(
        tmp_path,
        f"name: cli-fails\nworkload: {FAULTY}\nepochs: 3\nconfig:\n  points: 400\n  fail_after_samples: 100\n",
    )
    result = _orch(env, "jobs", "submit", "-f", str(spec), "--follow")
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    assert "FAILED (code_error)" in result.stderr and "ValueError: faulty workload" in result.stderr


def test_a_cancel_while_following_exits_3_and_ctrl_c_exits_130_without_cancelling(env, member, tmp_path):
    spec = _spec(tmp_path, DIGITS.format(name="cli-cancel").replace("epochs: 2", "epochs: 200"))
    interrupted = _popen(env, "jobs", "submit", "-f", str(spec), "--follow")
    job = _job_named(member, "cli-cancel")
    member.wait(job["id"], {"RUNNING"}, timeout_s=120)
    interrupted.send_signal(signal.SIGINT)  # Ctrl-C: stop following, the job goes on
    _, err = interrupted.communicate(timeout=30)
    assert interrupted.returncode == 130, err
    assert "goes on" in err and member.job(job["id"])["state"] == "RUNNING"

    follower = _popen(env, "jobs", "follow", "cli-cancel")
    time.sleep(3)
    assert member.http.post(f"/v1/jobs/{job['id']}/cancel").status_code == 200  # from elsewhere
    out, err = follower.communicate(timeout=120)
    assert follower.returncode == 3, out[-2000:] + err[-2000:]
    assert "CANCELLED" in out


def test_timeout_exits_124_and_the_job_goes_on_until_its_deadline(env, member, tmp_path):
    """The CLI's --timeout leaves the job running; the job's own deadline (max_runtime_s, docs/jobs.md
    "Deadlines") then stops it on the real cluster: a checkpoint first, then FAILED deadline_exceeded."""
    deadline = "epochs: 200\nmax_runtime_s: 10"
    spec = _spec(tmp_path, DIGITS.format(name="cli-timeout").replace("epochs: 2", deadline))
    result = _orch(env, "jobs", "submit", "-f", str(spec), "--follow", "--timeout", "5")
    assert result.returncode == 124, result.stdout[-2000:] + result.stderr[-2000:]
    assert "timed out after 5 s" in result.stderr
    job = _job_named(member, "cli-timeout")
    assert job["state"] not in ("CANCELLED", "CANCELLING", "FAILED")

    try:
        ended = member.wait(job["id"], {"FAILED"}, timeout_s=180)
    finally:
        member.http.post(f"/v1/jobs/{job['id']}/cancel")  # a no-op once it ended; else frees the cluster
    assert ended["reason"] == "deadline_exceeded", ended
    assert "past its max_runtime_s: checkpointed and stopped" in ended["message"], ended["message"]
    events = member.http.get(f"/v1/jobs/{job['id']}/events").json()
    asked = [e for e in events if e["reason"] == "deadline_reached"]
    assert len(asked) == 1 and asked[0]["to_state"] == "RUNNING", events
    # A checkpoint taken after the ask (its report may land just after the end), and the step the message names
    # is one of the job's checkpoints.
    asked_at = datetime.fromisoformat(asked[0]["created_at"])
    give_up = time.monotonic() + 30
    while True:
        checkpoints = member.http.get(f"/v1/jobs/{job['id']}/checkpoints", params={"envelope": "true"}).json()["items"]
        after = [c for c in checkpoints if datetime.fromisoformat(c["created_at"]) >= asked_at]
        if after or time.monotonic() > give_up:
            break
        time.sleep(1)
    assert after, (asked, checkpoints)
    named = re.search(r"the latest at step (\d+)", ended["message"])
    assert named and int(named.group(1)) in {c["step"] for c in checkpoints}, (ended["message"], checkpoints)
