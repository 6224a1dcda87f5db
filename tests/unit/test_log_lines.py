"""What a job's log shows (orchestrator/services/log_lines.py), on real logs of a local Ray cluster
(tests/unit/data/: the raw output of a 2-worker digits job and of a 2-worker user function whose rank 1 raised,
long paths shortened), and through GET /v1/jobs/{id}/logs, follow included."""

from __future__ import annotations

import asyncio
import logging
import re
from pathlib import Path

import httpx
import pytest

from orchestrator.backend import RunStatus
from orchestrator.services import logs as logs_service
from orchestrator.services.log_lines import strip_ansi, view
from orchestrator_contract.logs import DEDUP_ALLOW, RANK_MARKER, rank_marker
from tests.unit.api_helpers import ADMIN, auth, reconcile, run_token, tick

DATA = Path(__file__).parent / "data"
DIGITS = (DATA / "ray_train_digits.log").read_text()
USER = (DATA / "ray_train_user_function.log").read_text()
RANK0, RANK1 = "(RayTrainWorker pid=16353) ", "(RayTrainWorker pid=16384) "  # the digits job's workers
CHATTER = ("Checkpoint successfully created at:", "Reporting training result")


def lines(text: str) -> list[str]:
    return text.splitlines()


def test_the_raw_logs_are_what_the_filter_is_for():
    """The fixtures hold what the issue describes: colour codes and Ray Train's per-report lines."""
    assert "\x1b[36m(RayTrainWorker pid=16353)\x1b[0m" in DIGITS and "[repeated 5x across cluster]" in DIGITS
    assert sum(any(c in line for c in CHATTER) for line in lines(DIGITS)) == 4


def test_escape_codes_are_removed():
    assert "\x1b" not in view(DIGITS) and "\x1b" not in view(USER)
    assert "View the dashboard at http://127.0.0.1:35957 \n" in view(DIGITS)
    assert strip_ansi("\x1b[1m\x1b[32mok\x1b[39m\x1b[22m \x1b[2K\x1b[1Gdone") == "ok done"


def test_ray_train_chatter_is_quiet_and_everything_else_stays():
    quiet = view(DIGITS)
    plain = strip_ansi(DIGITS)
    assert not any(c in quiet for c in CHATTER)
    # Every other line, in order and unchanged: only the chatter lines went.
    assert lines(quiet) == [line for line in lines(plain) if not any(c in line for c in CHATTER)]
    assert len(lines(plain)) - len(lines(quiet)) == 4
    # Our training loop's progress: one line per epoch from rank 0, with what a person looks for.
    epochs = [line.removeprefix(RANK0) for line in lines(quiet) if "epoch " in line and "/3 step" in line]
    assert epochs[0] == "epoch 1/3 step 22: train_loss 1.361, val_loss 0.4394, val_accuracy 0.8972, 10811 samples/s"
    assert [e.split(":")[0] for e in epochs] == ["epoch 1/3 step 22", "epoch 2/3 step 44", "epoch 3/3 step 66"]
    assert "attempt 1 succeeded" in quiet and "Started training worker group of size 2" in quiet


def test_the_setting_keeps_the_chatter():
    assert view(DIGITS, keep_ray_chatter=True) == strip_ansi(DIGITS)


def test_the_users_lines_and_errors_all_stay():
    quiet = view(USER)
    for line in ("hello from rank 0: my own line", "hello from rank 1: my own line", "user epoch 1 rank 0 loss 1.000"):
        assert line in quiet
    assert quiet.count("a warning of mine") == 2  # stderr, each rank's
    assert quiet.count('ValueError("the user\'s bug on rank 1")') == 3  # the worker's traceback, and the driver's two
    assert lines(quiet) == lines(strip_ansi(USER).replace(DEDUP_HINT_TEXT, ""))


DEDUP_HINT_TEXT = (
    " (Ray deduplicates logs by default. Set RAY_DEDUP_LOGS=0 to disable log deduplication, or see "
    "https://docs.ray.io/en/master/ray-observability/user-guides/configure-logging.html#log-deduplication for more "
    "options.)"
)


def test_one_ranks_lines():
    rank0 = lines(view(DIGITS, rank=0))
    assert all(line.startswith(RANK0) for line in rank0)
    assert rank0[0] == RANK0 + "[rank 0/2] training worker started (pid 16353, host vm)"
    assert sum("epoch " in line for line in rank0) == 3
    assert lines(view(DIGITS, rank=1)) == [RANK1 + "[rank 1/2] training worker started (pid 16384, host vm)"]
    assert [line for line in lines(view(DIGITS, keep_ray_chatter=True, rank=1)) if "Reporting" in line] == [
        next(line for line in lines(strip_ansi(DIGITS)) if line.startswith(RANK1 + "Reporting training result 3"))
    ]
    assert view(DIGITS, rank=2) == ""  # no such rank: nothing, not everything


def test_one_ranks_error():
    rank1 = view(USER, rank=1)
    assert "ValueError: the user's bug on rank 1" in rank1 and "hello from rank 1" in rank1
    assert "rank 0" not in rank1.replace("[rank 1/2]", "") and "driver" not in rank1  # no other rank's, no driver's
    rank0 = view(USER, rank=0)
    # Rank 0's stderr line came before its marker (Ray forwards stdout and stderr apart): Ray's own lines
    # naming the ranks place it.
    assert lines(rank0)[:3] == [
        "(RayTrainWorker pid=17900) Setting up process group for: env:// [rank=0, world_size=2]",
        "(RayTrainWorker pid=17900) a warning of mine",
        "(RayTrainWorker pid=17900) [rank 0/2] training worker started (pid 17900, host vm)",
    ]
    assert "ValueError" not in rank0


def test_the_view_of_a_growing_log_only_grows():
    """What a follow relies on: the view of the first lines is the start of the view of them all."""
    for raw in (DIGITS, USER):
        raw_lines = raw.splitlines(keepends=True)
        for rank in (None, 0, 1):
            whole = view(raw, rank=rank)
            for cut in range(len(raw_lines) + 1):
                assert whole.startswith(view("".join(raw_lines[:cut]), rank=rank))


def test_other_nodes_and_a_restarted_worker_group():
    raw = "\n".join(
        [
            f"(RayTrainWorker pid=11, ip=10.0.0.2) {rank_marker(0, 2, 11, 'a')}",
            f"(RayTrainWorker pid=11, ip=10.0.0.3) {rank_marker(1, 2, 11, 'b')}",  # the same pid on another node
            "(RayTrainWorker pid=11, ip=10.0.0.2) zero",
            "(RayTrainWorker pid=11, ip=10.0.0.3) one",
            "(RayTrainWorker pid=11, ip=10.0.0.3) Reporting training result 1: TrainingReport(...) from rank 1",
            "(TrainController pid=5) Started training worker group of size 2: ",  # a worker died: a new group
            f"(RayTrainWorker pid=12, ip=10.0.0.3) {rank_marker(0, 2, 12, 'b')}",
            "(RayTrainWorker pid=12, ip=10.0.0.3) zero again",
            "(RayTrainWorker pid=99) a process that never said its rank",
            f"(RayTrainWorker pid=13) {rank_marker(1, 2, 14, 'c')}",  # a marker about another process: ignored
            "(RayTrainWorker pid=13) not rank 1",
        ]
    )
    assert [line.split(") ", 1)[1] for line in lines(view(raw, rank=0))] == [
        rank_marker(0, 2, 11, "a"),
        "zero",
        rank_marker(0, 2, 12, "b"),
        "zero again",
    ]
    assert [line.split(") ", 1)[1] for line in lines(view(raw, rank=1))] == [rank_marker(1, 2, 11, "b"), "one"]


def test_the_marker_passes_rays_deduplication():
    marker = rank_marker(3, 8, 4242, "node-a")
    assert re.search(DEDUP_ALLOW, marker) and RANK_MARKER.match(marker)["rank"] == "3"


def test_rank_0_prints_one_line_per_epoch(tmp_path, caplog):
    from tests.unit.harness import RecordingReporter, job_config
    from workers.runtime.context import LocalContext
    from workers.runtime.train_loop import run_training

    with caplog.at_level(logging.INFO, logger="workers.runtime.train_loop"):
        run_training(job_config("digits", workers=1, epochs=2), LocalContext(tmp_path), RecordingReporter())
    epochs = [r.getMessage() for r in caplog.records if r.getMessage().startswith("epoch ")]
    assert len(epochs) == 2
    pattern = r"epoch {}/2 step {}: train_loss [\d.]+, val_loss [\d.]+, val_accuracy [\d.]+, \d+ samples/s"
    assert re.fullmatch(pattern.format(1, 44), epochs[0]) and re.fullmatch(pattern.format(2, 88), epochs[1]), epochs


# --- the route --------------------------------------------------------------------------------------


def _started(client, backend, app, raw: str) -> str:
    job = client.post("/v1/jobs", json={"workload": "digits"}, headers=auth(ADMIN)).json()["id"]
    tick(app)
    backend.logs = lambda submission_id: raw  # what Ray has of the attempt
    return job


def test_the_route_serves_the_view(app, client, backend):
    job = _started(client, backend, app, DIGITS)
    get = lambda **params: client.get(f"/v1/jobs/{job}/logs", params=params, headers=auth(ADMIN))  # noqa: E731
    assert get().text == view(DIGITS)
    assert get(rank=0).text == view(DIGITS, rank=0)
    assert get(rank=0, tail=1).text == lines(view(DIGITS, rank=0))[-1] + "\n"  # the tail of rank 0's lines
    assert get(rank=1, attempt=1).text == view(DIGITS, rank=1)
    assert get(rank=-1).status_code == 422 and get(rank="x").status_code == 422


@pytest.mark.parametrize("settings_overrides", [{"log_ray_chatter": True}])
def test_the_setting_serves_the_chatter(app, client, backend):
    job = _started(client, backend, app, DIGITS)
    assert client.get(f"/v1/jobs/{job}/logs", headers=auth(ADMIN)).text == strip_ansi(DIGITS)


def test_a_follow_of_one_rank_sends_whole_lines_as_they_come(app, client, backend):
    job = _started(client, backend, app, "")
    printed = ""
    backend.logs = lambda submission_id: printed
    service = app.state.service
    follows = logs_service.LogFollows(service.sessions, backend, service.log_archive, max_per_key=2, poll_s=0)

    def whole_lines(text: str) -> str:
        return view(text[: text.rfind("\n") + 1], rank=1)

    async def scenario() -> str:
        nonlocal printed
        stream = follows.start(job, "k", rank=1)
        received = ""
        for start in range(0, len(USER), 97):  # Ray's output as it grows, cut anywhere (mid-line too)
            printed = USER[: start + 97]
            expected = whole_lines(printed)
            if expected != received:  # something new of rank 1's, whole lines only: exactly that is sent
                chunk = await anext(stream)
                assert received + chunk == expected
                received += chunk
        done = {"attempt": 1, "events": [{"type": "state", "state": "running"}, {"type": "state", "state": "failed"}]}
        token = run_token(client, backend)
        client.post(f"/internal/v1/jobs/{job}/events", json=done, headers=auth(token))
        backend.runs[f"{job}-1"] = RunStatus.FAILED
        backend.exit_codes[f"{job}-1"] = 3  # the driver's exit status for a failure it reported
        reconcile(app)  # Ray confirms the reported end: the job ends
        return received + "".join([chunk async for chunk in stream])  # the end: the stream stops

    assert asyncio.run(scenario()) == view(USER, rank=1)


def test_a_followed_rank_over_http(live):
    backend = live.backend
    with httpx.Client(base_url=live.url, timeout=10, headers=auth(ADMIN)) as http:
        job = http.post("/v1/jobs", json={"workload": "digits"}).json()["id"]
        tick(live.app)
        backend.logs = lambda submission_id: DIGITS
        token = run_token(http, backend)
        done = {
            "attempt": 1,
            "events": [{"type": "state", "state": "running"}, {"type": "state", "state": "succeeded"}],
        }
        http.post(f"/internal/v1/jobs/{job}/events", json=done, headers=auth(token))
        backend.runs[f"{job}-1"] = RunStatus.SUCCEEDED
        reconcile(live.app)  # Ray confirms the reported end: the job ends
        followed = http.get(f"/v1/jobs/{job}/logs", params={"follow": "true", "rank": 0, "tail": 2})
        assert followed.status_code == 200 and followed.text == "\n".join(lines(view(DIGITS, rank=0))[-2:]) + "\n"


def test_the_archive_keeps_a_plain_copy(app, client, backend, tmp_path):
    from orchestrator.loops.log_archive import LogArchiver

    job = _started(client, backend, app, DIGITS)
    service = app.state.service
    LogArchiver(service.sessions, backend, service.log_archive).tick()
    archived = (tmp_path / "storage" / job / "logs" / "attempt-0001.log").read_text()
    assert archived == strip_ansi(DIGITS)  # no escape codes; the chatter kept, for ORCHESTRATOR_LOG_RAY_CHATTER
    backend.logs = lambda submission_id: None  # Ray lost it: served from the archive, the same view
    assert client.get(f"/v1/jobs/{job}/logs", params={"rank": 0}, headers=auth(ADMIN)).text == view(DIGITS, rank=0)


def test_drivers_run_with_print_once_and_markers_never_held_back():
    from orchestrator.services.launch import driver_env
    from orchestrator.settings import Settings

    env = driver_env("jtk_x", Settings())
    assert env["RAY_TRAIN_ENABLE_PRINT_PATCH"] == "0"  # Ray Train's print patch printed every line twice
    assert env["RAY_DEDUP_LOGS_ALLOW_REGEX"] == DEDUP_ALLOW
