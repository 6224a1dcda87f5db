"""Population based training on the real local Ray cluster: a poor trial takes over a good one's checkpoint
with a perturbed copy of its learning rate, and trains on from there."""

from __future__ import annotations

import pytest

from tests.integration.test_sweeps_on_ray import (
    _base,
    _deploy_and_check,
    _submit,
    _trials,
    _trials_dir,
    _wait,
    _wait_no_train_workers,
    wait_cluster_idle,
)
from tests.trial_checkpoints import assert_trial_checkpoints_agree

pytestmark = pytest.mark.integration

# Seed 10 samples lr.base 0.31 and 9.5e-05 from this range: one trial learns digits in an epoch, the other
# barely moves. The test finds out which is which from their metrics, not from this comment.
SPACE = {"lr.base": {"type": "loguniform", "low": 1e-5, "high": 0.5}}
SEED = 10
EPOCHS = 4


def test_pbt_clones_the_good_trial_into_the_poor_one(admin, ray_cluster):
    first_config: dict[str, float] = {}  # trial id -> its lr.base when the control plane first saw it

    def watch(_sweep):
        for trial in _trials(admin, sweep["id"]):
            first_config.setdefault(trial["tune_id"], trial["config"]["lr.base"])

    # PBT clones only between trials that train side by side: both must get their workers at once.
    wait_cluster_idle(ray_cluster)
    sweep = _submit(
        admin,
        name="pbt-digits",
        # Epochs of ~3 s (2 per worker: ~360 steps): PBT clones only a trial that was on top when it reported
        # while the other had a score, into one that reports after that with an epoch left. Short epochs
        # (~0.7 s at 8 per worker) let one trial's first three reach Tune before the other's first.
        base=_base(epochs=EPOCHS, batch={"per_worker": 2}),
        search_space=SPACE,
        algorithm="random",
        seed=SEED,
        num_samples=2,
        max_concurrent_trials=2,
        # Perturb only (x0.8 or x1.2), never resample: the cloned rate stays next to the good one.
        scheduler={"type": "pbt", "perturbation_interval": 1, "quantile_fraction": 0.5, "resample_probability": 0},
    )
    sweep = _wait(admin, sweep["id"], timeout_s=300, on_poll=watch)
    assert sweep["trials"]["SUCCEEDED"] == 2, sweep
    _wait_no_train_workers(ray_cluster)

    trials = _trials(admin, sweep["id"])
    history = {t["tune_id"]: admin.http.get(f"/v1/trials/{t['id']}/metrics").json() for t in trials}
    first_accuracy = {tune_id: points[0]["values"]["val_accuracy"] for tune_id, points in history.items()}
    good, poor = sorted(trials, key=lambda t: first_accuracy[t["tune_id"]], reverse=True)
    assert first_accuracy[good["tune_id"]] > 0.8 and first_accuracy[poor["tune_id"]] < 0.5, first_accuracy

    # The poor one now has the good one's rate, perturbed (x0.8 or x1.2 at each clone). Once the clone has
    # caught up, PBT may clone back the other way (which one leads at an epoch is then a coin toss), so the
    # rate may be a few perturbations away from the good trial's first one, but never its own first rate:
    # no chain of perturbations alone gets from < 1e-3 to the good trial's neighbourhood in EPOCHS steps.
    good_lr = first_config[good["tune_id"]]
    assert first_config[poor["tune_id"]] < 1e-3 < good_lr, first_config
    assert any(poor["config"]["lr.base"] == pytest.approx(lr) for lr in _perturbations_of(good_lr, EPOCHS)), (
        poor,
        first_config,
    )

    # Its history goes on through the clone (from the good trial's epoch, which may be one either side of
    # its own), up to the last epoch, the last ones at the good trial's level.
    points = history[poor["tune_id"]]
    epochs = [p["epoch"] for p in points]
    assert epochs[0] == 1 and epochs[-1] == EPOCHS and epochs == sorted(set(epochs)), points
    assert points[-1]["values"]["val_accuracy"] > 0.8, points
    assert poor["iterations"] == EPOCHS and poor["best_metric"] > 0.8
    # The trial's best checkpoint is one of its own Train runs' (a new run after the clone).
    assert poor["checkpoint_path"] and f"/{poor['tune_id']}-" in poor["checkpoint_path"], poor["checkpoint_path"]
    # Retention keeps what the cloned trial names, across its runs; storage holds exactly what is recorded;
    # and the cloned trial deploys from its new run's checkpoint.
    assert_trial_checkpoints_agree(admin.http, sweep["id"], _trials_dir(sweep))
    _deploy_and_check(admin, ray_cluster, "pbt-clone", poor)


def _perturbations_of(lr: float, times: int) -> set[float]:
    """Every rate PBT can make of `lr` with 1 to `times` perturbations (x0.8 or x1.2, clipped to the space)."""
    low, high = SPACE["lr.base"]["low"], SPACE["lr.base"]["high"]
    reachable: set[float] = set()
    frontier = {lr}
    for _ in range(times):
        frontier = {min(max(rate * factor, low), high) for rate in frontier for factor in (0.8, 1.2)}
        reachable |= frontier
    return reachable
