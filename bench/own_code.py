"""Uploaded code against the built-in workload: submit -> first step, and uploading a 100 MB package.

    .venv/bin/python bench/own_code.py [--rounds 3] [--upload-mb 100]

The service runs as a user runs it (``orchestrator serve`` in a subprocess with its own local Ray cluster
of 2 CPUs: the chaos tests' harness, ``tests/chaos/harness.py``).

(a) Submit -> first step. The same job (digits, 1 epoch, 2 workers x 8, a metric point every step) with
    the built-in ``digits`` workload and with ``own_digits:build`` from an uploaded package whose ``build``
    returns what digits builds (``tests/chaos/own_code.py``: same model, same data). Measured on the
    control plane's clock: the job's ``created_at`` to the ``created_at`` of its first metric point (step
    1); the job is then cancelled and the next one waits until it has ended. A warm-up run of each arm
    first (the own-code one uploads the package to Ray's store and the node caches it); then ``--rounds``
    rounds, the arms alternating which goes first. Prints each run and the ratio own code / built-in of
    the medians. Goal: <= 1.15.

(b) Uploading a package. A zip holding ``--upload-mb`` MB (10^6 bytes) of random bytes, stored (random
    bytes do not compress, so the zip is as large as its contents), sent with POST /v1/code to the service
    in its own process. Prints the upload rate (MB/s, from the start of the request to its 201) and the
    server process's resident memory (``/proc/<pid>/status``: ``VmRSS`` sampled every 5 ms, and
    ``VmHWM``, the kernel's peak) before and during the upload. Goal: growth far below the package size
    (the upload is spooled to a temporary file and read in 1 MB chunks). For reference, the same bytes
    deflated into a zip in this process, as the server's repacking does.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.chaos.harness import TERMINAL, Api, ServiceProcess  # noqa: E402
from tests.chaos.own_code import OWN_DIGITS, OWN_DIGITS_WORKLOAD, upload, zip_package  # noqa: E402
from tests.chaos.recovery import parse_time  # noqa: E402

GOAL_RATIO = 1.15
ARMS = ("built-in", "own code")
SPEC = {
    "epochs": 1,
    "seed": 7,
    "scaling": {"num_workers": 2},
    "batch": {"per_worker": 8},
    "metrics_every_steps": 1,
}


def first_step_s(api: Api, spec: dict) -> float:
    """Submit, wait for the first metric point, cancel, wait for the end; seconds from created to step 1."""
    job = api.submit(spec)
    deadline = time.monotonic() + 300
    while not (points := api.metrics(job["id"])):
        state = api.job(job["id"])
        assert state["state"] not in TERMINAL, state
        assert time.monotonic() < deadline, f"no first step after 300 s: {state}"
        time.sleep(0.1)
    seconds = min(parse_time(p["created_at"]) for p in points) - parse_time(job["created_at"])
    api.http.post(f"/v1/jobs/{job['id']}/cancel")
    api.wait(job["id"], {"CANCELLED", "SUCCEEDED"}, timeout_s=120)
    return seconds


def startup(api: Api, rounds: int) -> dict[str, list[float]]:
    code_id = upload(api, zip_package(OWN_DIGITS))
    specs = {
        "built-in": {**SPEC, "workload": "digits"},
        "own code": {**SPEC, "workload": OWN_DIGITS_WORKLOAD, "code": {"id": code_id}},
    }
    for arm in ARMS:  # warm-up: the package reaches Ray's store and the node's cache; imports are warm
        print(f"warm-up {arm}: {first_step_s(api, {**specs[arm], 'name': f'warm-{arm}'}):.2f} s", flush=True)
    times: dict[str, list[float]] = {arm: [] for arm in ARMS}
    for round_number in range(1, rounds + 1):
        order = ARMS if round_number % 2 else ARMS[::-1]
        for arm in order:
            seconds = first_step_s(api, {**specs[arm], "name": f"bench-{round_number}"})
            times[arm].append(seconds)
            print(f"round {round_number}: {arm}: submit -> first step {seconds:.2f} s", flush=True)
    return times


def rss_kib(pid: int, field: str = "VmRSS") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} for pid {pid}")


def upload_big(svc: ServiceProcess, megabytes: int) -> dict:
    pid = svc.process.pid
    with tempfile.TemporaryDirectory(prefix="bench-own-code-") as folder:
        payload = Path(folder) / "weights.bin"
        with payload.open("wb") as out:
            for _ in range(megabytes):
                out.write(os.urandom(1_000_000))
        package = Path(folder) / "big.zip"
        with zipfile.ZipFile(package, "w", compression=zipfile.ZIP_STORED) as archive:
            archive.write(payload, "weights.bin")
        size = package.stat().st_size

        started = time.perf_counter()
        with zipfile.ZipFile(Path(folder) / "deflated.zip", "w", compression=zipfile.ZIP_DEFLATED) as archive:
            archive.write(payload, "weights.bin")
        deflate_s = time.perf_counter() - started

        before, hwm_before = rss_kib(pid), rss_kib(pid, "VmHWM")
        peak = [before]
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                peak[0] = max(peak[0], rss_kib(pid))
                time.sleep(0.005)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        started = time.perf_counter()
        with package.open("rb") as source:
            response = svc.api().http.post("/v1/code", files={"file": ("big.zip", source)}, timeout=900)
        seconds = time.perf_counter() - started
        done.set()
        sampler.join()
        assert response.status_code == 201, response.text
        return {
            "size": size,
            "seconds": seconds,
            "deflate_s": deflate_s,
            "rss_before_kib": before,
            "rss_peak_kib": peak[0],
            "hwm_growth_kib": rss_kib(pid, "VmHWM") - hwm_before,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--upload-mb", type=int, default=100)
    args = parser.parse_args()

    # A Ray temp dir of its own: Ray's job supervisor gives each driver the address in <temp dir>/ray/
    # ray_current_cluster, which any local cluster started later on this machine (another test run)
    # overwrites in the shared /tmp/ray, and the drivers then join that cluster and fail.
    ray_tmp = tempfile.mkdtemp(prefix="bo-", dir="/tmp")  # short: Ray's socket paths live under it
    svc = ServiceProcess(Path(tempfile.mkdtemp(prefix="bench-own-code-")), settings={"RAY_TMPDIR": ray_tmp})
    try:
        svc.start()
        times = startup(svc.api(), args.rounds)
        big = upload_big(svc, args.upload_mb)
    finally:
        svc.stop()

    print("\n| arm | submit -> first step (s), per round | median (s) |")
    print("|---|---|---|")
    for arm in ARMS:
        print(f"| {arm} | {', '.join(f'{t:.2f}' for t in times[arm])} | {statistics.median(times[arm]):.2f} |")
    ratio = statistics.median(times["own code"]) / statistics.median(times["built-in"])
    verdict = "met" if ratio <= GOAL_RATIO else "NOT met"
    print(f"\nown code / built-in (medians): {ratio:.3f}; goal <= {GOAL_RATIO}: {verdict}")

    mb = big["size"] / 1e6
    growth = big["rss_peak_kib"] - big["rss_before_kib"]
    print(
        f"\nupload of a {mb:.1f} MB package: {big['seconds']:.1f} s, {mb / big['seconds']:.1f} MB/s "
        f"(deflating the same bytes into a zip here: {big['deflate_s']:.1f} s, {mb / big['deflate_s']:.1f} MB/s)"
    )
    print(
        f"server RSS {big['rss_before_kib'] / 1024:.0f} MiB before, peak {big['rss_peak_kib'] / 1024:.0f} MiB "
        f"during: +{growth / 1024:.1f} MiB ({growth * 1024 / big['size']:.1%} of the package); "
        f"VmHWM +{big['hwm_growth_kib'] / 1024:.1f} MiB"
    )


if __name__ == "__main__":
    main()
