"""``orch jobs submit --follow`` / ``orch jobs follow`` against the unit-test app over real HTTP: log lines,
state changes and progress as plain lines off a terminal, and every exit code: 0, 1, 3, 124 and 130
(Ctrl-C never cancels unless --cancel-on-interrupt)."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from orchestrator.backend import RunStatus
from orchestrator_client.cli import follow
from tests.unit import cli_support
from tests.unit.api_helpers import ADMIN
from tests.unit.cli_support import finish_run, newest, orch, report, running, start

_own_config = cli_support.quick_follow


@pytest.fixture
def live(live):
    """The live server; after the test, what it left queued is cancelled, so that the server ends the log
    streams a stopped follow left open (instead of the server's shutdown waiting for them)."""
    yield live
    for job in json.loads(orch(live, "jobs", "list", "-o", "json", "--state", "QUEUED").stdout):
        orch(live, "jobs", "cancel", job["id"], "-y")


@pytest.fixture
def spec_file(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text("name: followed\nworkload: digits\nepochs: 3\nscaling:\n  num_workers: 1\n")
    return path


def _submit_following(live, spec_file, action):
    """``orch jobs submit --follow`` while ``action`` runs in a thread once the follow has started (the job is
    submitted by then): it plays the job's driver or someone else."""

    def run():
        time.sleep(0.5)
        action()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    result = orch(live, "jobs", "submit", "-f", str(spec_file), "--follow", "--timeout", "30")
    thread.join()
    return result


def test_follow_to_succeeded_shows_logs_progress_and_exits_0(live, spec_file):
    def driver():
        job_id = newest(live)
        token = running(
            live,
            job_id,
            {"type": "metrics", "epoch": 1, "step": 7, "values": {"train_loss": 0.61, "samples_per_s": 900.0}},
        )
        time.sleep(0.4)
        report(live, job_id, token, {"type": "metrics", "epoch": 2, "step": 14, "values": {"val_accuracy": 0.93}})
        time.sleep(0.4)
        report(
            live, job_id, token, {"type": "state", "state": "succeeded", "result": {"metrics": {"val_accuracy": 0.97}}}
        )
        finish_run(live, job_id)

    result = _submit_following(live, spec_file, driver)
    assert result.exit_code == 0, result.output
    job_id = newest(live)
    out = result.stdout
    assert f"log of {job_id}-1" in out  # the job's own output
    assert "==> QUEUED -> STARTING" in out and "==> STARTING -> RUNNING" in out and "==> RUNNING -> SUCCEEDED" in out
    assert "epoch 1/3 | step 7 | train_loss 0.61" in out and "900 samples/s" in out
    assert "val_accuracy 0.93" in out  # the epoch's metrics kept beside the step's
    assert f"job {job_id} SUCCEEDED val_accuracy=0.97" in out
    assert "\x1b[" not in result.output  # off a terminal: no colour, no live display


def test_a_failed_job_exits_1_with_its_reason_and_message(live, spec_file):
    def driver():
        job_id = newest(live)
        running(
            live,
            job_id,
            {"type": "state", "state": "failed", "reason": "code_error", "message": "ValueError: bad [rank 0/2] [/x]"},
        )
        finish_run(live, job_id, RunStatus.FAILED)

    result = _submit_following(live, spec_file, driver)
    assert result.exit_code == 1, result.output
    assert "FAILED (code_error): ValueError: bad [rank 0/2] [/x]" in result.stderr
    # brackets in a message are text, not rich markup, in a table too
    assert "ValueError: bad [rank 0/2] [/x]" in orch(live, "jobs", "get", "followed").stdout


def test_a_job_cancelled_elsewhere_exits_3(live, spec_file):
    def canceller():
        job_id = newest(live)
        start(live, job_id)
        cancelled = httpx.post(f"{live.url}/v1/jobs/{job_id}/cancel", headers={"Authorization": f"Bearer {ADMIN}"})
        assert cancelled.status_code == 200
        finish_run(live, job_id, RunStatus.STOPPED)

    result = _submit_following(live, spec_file, canceller)
    assert result.exit_code == 3, result.output
    assert "CANCELLED" in result.stdout


def test_timeout_exits_124_and_the_job_goes_on(live, spec_file):
    result = orch(live, "jobs", "submit", "-f", str(spec_file), "--follow", "--timeout", "0.5")
    assert result.exit_code == 124, result.output
    assert "timed out after 0.5 s" in result.stderr
    job = json.loads(orch(live, "jobs", "list", "-o", "json").stdout)[0]
    assert job["state"] == "QUEUED"  # not cancelled


def _interrupt_on_second_poll(monkeypatch):
    real_poll = follow.JobFollow.poll
    calls = []

    def poll(self):
        calls.append(1)
        if len(calls) >= 2:
            raise KeyboardInterrupt
        real_poll(self)

    monkeypatch.setattr(follow.JobFollow, "poll", poll)


def test_ctrl_c_stops_following_exits_130_and_never_cancels(live, spec_file, monkeypatch):
    _interrupt_on_second_poll(monkeypatch)
    result = orch(live, "jobs", "submit", "-f", str(spec_file), "--follow")
    assert result.exit_code == 130, result.output
    assert "goes on" in result.stderr
    job = json.loads(orch(live, "jobs", "list", "-o", "json").stdout)[0]
    assert job["state"] == "QUEUED"


def test_ctrl_c_with_cancel_on_interrupt_cancels(live, spec_file, monkeypatch):
    _interrupt_on_second_poll(monkeypatch)
    result = orch(live, "jobs", "submit", "-f", str(spec_file), "--follow", "--cancel-on-interrupt")
    assert result.exit_code == 130, result.output
    job = json.loads(orch(live, "jobs", "list", "-o", "json").stdout)[0]
    assert job["state"] == "CANCELLED" and "cancelling" in result.stderr


def test_follow_and_wait_follow_an_existing_job(live, spec_file):
    job_id = json.loads(orch(live, "jobs", "submit", "-f", str(spec_file), "-o", "json").stdout)["id"]
    start(live, job_id)
    finish_run(live, job_id)
    followed = orch(live, "jobs", "follow", "followed")
    assert followed.exit_code == 0 and f"log of {job_id}-1" in followed.stdout
    waited = orch(live, "jobs", "wait", job_id, "--follow")
    assert waited.exit_code == 0 and "SUCCEEDED" in waited.stdout


def test_progress_line_names_the_jobs_own_metrics():
    class Job:
        state, spec = "RUNNING", {"epochs": 5}

    text = follow.progress_text(Job(), {"epoch": 2, "step": 40, "val_mae": 0.25, "lr": 0.1, "samples_per_s": 10.0}, 65)
    assert text == "RUNNING | epoch 2/5 | step 40 | val_mae 0.25 | 10 samples/s | 1m05s"
