"""A follow reads each byte once (docs/security.md, "Reliability").

Following a log re-read the whole of it every poll (1 s), from Ray and from the archived
copy, and ran the whole text through the log view again for every follower: a 50 MB log followed by 50 clients
was 100 MB read and 2.5 GB filtered a second. On the old code (at 3b3888e) the two byte-count tests failed:
``test_a_follower_of_a_long_log_reads_each_byte_from_ray_once`` with ``assert 3791020 <= 273990`` (2,153,110
characters from Ray and 1,637,910 bytes of the archive for a 273,990-byte log: all of it at every poll), and
``test_a_follower_of_a_log_ray_lost_reads_each_byte_of_the_archive_once`` with ``assert 2153110 <= 273990``.

Now a followed job's output is read once for all its followers: Ray's log tail (each byte once, then only what
is new) while Ray has the run, else the archived copy from the byte where the last read stopped. Counted through
the fake cluster (every character it hands over) and through the archive's filesystem (every byte read)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from orchestrator.backend import RunStatus
from orchestrator.loops.log_archive import LogArchive
from orchestrator.services.logs import LogFollows
from orchestrator.storage import RunStorages
from tests.unit.api_helpers import ADMIN, auth, reconcile, run_token, submit, tick


def printed(first: int, count: int) -> str:
    """Lines of a training log, as rank 0 of a Ray Train job prints them (100-odd bytes each)."""
    return "".join(
        f"(RayTrainWorker pid=4242) epoch {i // 100 + 1}/50 step {i}: train_loss 0.{i:06d}, val_accuracy 0.{i:06d}\n"
        for i in range(first, first + count)
    )


class CountingFile:
    def __init__(self, counter: CountingFs, inner):
        self.counter, self.inner = counter, inner

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.inner.close()

    def read(self, *args):
        data = self.inner.read(*args)
        self.counter.bytes_read += len(data)
        return data

    def read_at(self, *args):
        data = self.inner.read_at(*args)
        self.counter.bytes_read += len(data)
        return data

    def __getattr__(self, name):
        return getattr(self.inner, name)


class CountingFs:
    """The archive's filesystem, counting every byte read from a file of it."""

    def __init__(self, inner):
        self.inner, self.bytes_read = inner, 0

    def open_input_stream(self, path):
        return CountingFile(self, self.inner.open_input_stream(path))

    def open_input_file(self, path):
        return CountingFile(self, self.inner.open_input_file(path))

    def __getattr__(self, name):
        return getattr(self.inner, name)


def counted_archive(service) -> tuple[LogArchive, CountingFs]:
    storage = service.storages.of(None)  # the default cluster's
    fs = CountingFs(storage.fs)
    counted = SimpleNamespace(fs=fs, run_dir=storage.run_dir, storage_path=storage.storage_path)
    return LogArchive(RunStorages(counted)), fs


def running_job(app, client) -> tuple[str, str]:
    job = submit(client, ADMIN).json()["id"]
    tick(app)
    token = run_token(client, app.state.service.backend)
    report_state(client, job, token, "running")
    return job, token


def report_state(client, job: str, token: str, state: str) -> None:
    batch = {"attempt": 1, "events": [{"type": "state", "state": state}]}
    assert client.post(f"/internal/v1/jobs/{job}/events", json=batch, headers=auth(token)).status_code == 200


async def follow_as_it_grows(follows: LogFollows, job: str, grow, end) -> str:
    """One follower from the start and one that joins later with ``tail=3``; the log grows five times, then the
    job ends. Returns what the first follower received in all."""
    first = follows.start(job, "k")
    received = await anext(first)
    for step in range(5):
        more = printed(2000 + 200 * step, 200)
        grow(more)
        chunk = await anext(first)
        assert chunk == more
        received += chunk
        if step == 2:
            late = follows.start(job, "k", tail=3)
            assert await anext(late) == "".join(more.splitlines(keepends=True)[-3:])
    end()
    received += "".join([chunk async for chunk in first])
    assert [chunk async for chunk in late] == [printed(2000 + 200 * 3, 400)]  # what it had not been sent
    assert follows.active("k") == 0
    return received


def test_a_follower_of_a_long_log_reads_each_byte_from_ray_once(app, client, backend):
    job, token = running_job(app, client)
    submission = f"{job}-1"
    backend.log_texts[submission] = printed(0, 2000)
    service = app.state.service
    archive, fs = counted_archive(service)
    archive.write(job, 1, backend.log_texts[submission])  # the archiver's copy, as while a job runs
    follows = LogFollows(service.sessions, backend, archive, max_per_key=4, poll_s=0)

    def grow(more: str) -> None:
        backend.log_texts[submission] += more

    def end() -> None:
        report_state(client, job, token, "succeeded")
        backend.runs[submission] = RunStatus.SUCCEEDED
        reconcile(app)  # which confirms the reported end

    received = asyncio.run(follow_as_it_grows(follows, job, grow, end))
    whole = backend.log_texts[submission]
    assert received == whole
    read, size = backend.log_chars_read + fs.bytes_read, len(whole.encode())
    assert read <= size


def test_a_follower_of_a_log_ray_lost_reads_each_byte_of_the_archive_once(app, client, backend):
    job, _ = running_job(app, client)
    del backend.runs[f"{job}-1"]  # Ray has no record of it any more (its head was replaced): the archive is all
    service = app.state.service
    archive, fs = counted_archive(service)
    copy = printed(0, 2000)
    archive.write(job, 1, copy)
    follows = LogFollows(service.sessions, backend, archive, max_per_key=4, poll_s=0)

    def grow(more: str) -> None:
        nonlocal copy
        copy += more
        archive.write(job, 1, copy)  # the archiver rewrites the whole copy

    def end() -> None:  # a report of its end waits for Ray, which lost the job: the user cancels it
        assert client.post(f"/v1/jobs/{job}/cancel", headers=auth(ADMIN)).status_code == 200
        reconcile(app)

    received = asyncio.run(follow_as_it_grows(follows, job, grow, end))
    assert received == copy
    read, size = backend.log_chars_read + fs.bytes_read, len(copy.encode())
    assert read <= size


def test_a_follow_goes_on_across_ray_going_away_and_a_new_attempt_sending_each_line_once(app, client, backend):
    job, _ = running_job(app, client)
    first, second = f"{job}-1", f"{job}-2"
    backend.log_texts[first] = printed(0, 50)
    service = app.state.service
    service.log_archive.write(job, 1, printed(0, 30))  # the archiver's copy lags behind Ray's
    follows = LogFollows(service.sessions, backend, service.log_archive, max_per_key=4, poll_s=0)

    async def scenario() -> None:
        stream = follows.start(job, "k")
        assert await anext(stream) == printed(0, 50)
        # Ray cannot be reached: the archive is read, and only its lines past those sent are sent.
        backend.available = False
        backend.log_texts[first] = printed(0, 80)
        service.log_archive.write(job, 1, printed(0, 60))
        assert await anext(stream) == printed(50, 10)
        # Ray is back: its tail starts from the first byte again, and only the lines not had are sent.
        backend.available = True
        assert await anext(stream) == printed(60, 20)
        # The head died: a new attempt, whose log is sent from its first line.
        del backend.runs[first]
        reconcile(app)
        assert await anext(stream) == f"log of {second}\n"
        # The job ends; its driver's last words, with no line break after them, end the stream.
        backend.log_texts[second] = f"log of {second}\nbye"
        backend.runs[second] = RunStatus.SUCCEEDED
        token = run_token(client, backend)
        done = {
            "attempt": 2,
            "events": [{"type": "state", "state": "running"}, {"type": "state", "state": "succeeded"}],
        }
        assert client.post(f"/internal/v1/jobs/{job}/events", json=done, headers=auth(token)).status_code == 200
        assert [chunk async for chunk in stream] == ["bye"]

    asyncio.run(scenario())
    assert follows.active("k") == 0
