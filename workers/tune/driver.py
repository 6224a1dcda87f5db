"""Ray Job entrypoint for one attempt of a sweep.

    python -m workers.tune.driver --sweep-id ID --attempt N

As a job's driver (``workers.train.driver``): first exchanges the attempt's claim code for the sweep's token, then
fetches the sweep's assignment from the control plane and runs it (``workers.tune.attempt``: Ray Tune over it,
the sweep's state and every trial's news reported), imported only then. Exit status as ``workers.train.driver``
(``DriverExit``).
"""

from __future__ import annotations

import os
import sys

# Tune saves its experiment state (what Tuner.restore reads) at most this often; a trial created after the
# last save is unknown to the next attempt (its row ends CANCELLED with the sweep).
os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "2")
# No CSV/JSON/TensorBoard result files per trial: the control plane keeps the history.
os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")

from orchestrator_contract.sweeps import SweepAssignment
from workers.train.driver import fetch_assignment, start_driver


def main(argv: list[str] | None = None) -> int:
    started = start_driver(argv, "python -m workers.tune.driver", __doc__.splitlines()[0], "sweep-id")
    if isinstance(started, int):
        return started
    sweep_id, attempt, url, token = started
    assignment = fetch_assignment(url, sweep_id, attempt, token, "sweeps", SweepAssignment)
    # Here, after the claim, not at the top: see workers.train.driver.
    import ray

    from workers.tune.attempt import run_sweep

    ray.init()  # inside a Ray Job this joins the job's cluster
    return run_sweep(assignment, url, token)


if __name__ == "__main__":
    sys.exit(main())
