"""kill -9 of the control plane while a sweep runs: the next start adopts the sweep and its running driver;
trial news reported while it was down arrives, no trial is duplicated, max_concurrent_trials holds, and
the trials' checkpoints in storage are exactly those the database records."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.chaos.harness import Api, wait_until
from tests.chaos.test_control_plane_kill import DOWN_S
from tests.trial_checkpoints import assert_trial_checkpoints_agree

pytestmark = pytest.mark.chaos

EPOCHS = 3
SWEEP = {
    "name": "chaos-sweep",
    "base": {"workload": "digits", "epochs": EPOCHS, "scaling": {"num_workers": 2, "cpus_per_worker": 0.45}},
    "search_space": {"lr.base": {"type": "grid", "values": [0.3, 0.2, 0.1]}},
    "algorithm": "grid",
    "max_concurrent_trials": 1,
}


def trials(api: Api, sweep_id: str) -> list[dict]:
    response = api.http.get(f"/v1/sweeps/{sweep_id}/trials")
    response.raise_for_status()
    return response.json()


def test_control_plane_kill_while_a_sweep_runs(service):
    api = service.api()
    response = api.http.post("/v1/sweeps", json=SWEEP)
    assert response.status_code == 201, response.text
    sweep_id = response.json()["id"]
    try:
        wait_until(lambda: any(t["iterations"] >= 1 for t in trials(api, sweep_id)), 240, "a trial's first epoch")
        service.kill()
        time.sleep(DOWN_S)  # the trial trains on; the driver's reporter buffers its news
        service.restart_adopting_the_head()

        most_running, deadline = 0, time.monotonic() + 300
        while (sweep := api.http.get(f"/v1/sweeps/{sweep_id}").json())["state"] not in {
            "SUCCEEDED",
            "FAILED",
            "CANCELLED",
        }:
            assert time.monotonic() < deadline, sweep
            most_running = max(most_running, sweep["trials"]["RUNNING"])
            time.sleep(0.5)
        assert sweep["state"] == "SUCCEEDED", sweep
    finally:
        try:
            api.http.post(f"/v1/sweeps/{sweep_id}/cancel")  # a failed scenario leaves nothing running
        except httpx.TransportError:
            pass

    # The driver was adopted, not replaced; one row per Tune trial; every epoch of every trial arrived.
    assert sweep["attempt"] == 1 and service.submissions(sweep_id) == [f"{sweep_id}-1"]
    after = trials(api, sweep_id)
    assert len(after) == 3 and len({t["tune_id"] for t in after}) == 3, after
    assert [(t["state"], t["iterations"]) for t in after] == [("SUCCEEDED", EPOCHS)] * 3, after
    for trial in after:
        epochs = [p["epoch"] for p in api.http.get(f"/v1/trials/{trial['id']}/metrics").json()]
        assert epochs == list(range(1, EPOCHS + 1)), (trial["tune_id"], epochs)
    assert most_running <= SWEEP["max_concurrent_trials"]
    # As the job scenarios check: storage holds exactly the checkpoints the database records, each one
    # verifies, each trial names its best kept one, and each trial's last epoch arrived with the metrics Ray
    # Train recorded for it (the news buffered while the control plane was down, unchanged).
    assert_trial_checkpoints_agree(api.http, sweep_id, service.storage / sweep_id / "trials")
