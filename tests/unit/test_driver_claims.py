"""The driver's side of the claim (``workers.runtime.claim``): the exchange before any heavy import, one nonce across
retries, a refusal not retried, and the token hidden wherever Ray shows a value
(docs/security.md, "Run tokens are never in Ray's job table")."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys

import httpx
import pytest

from workers.runtime import claim as claim_module
from workers.runtime.claim import ClaimRefused, RunToken, bearer, claim_token, reveal
from workers.runtime.retry import RetryPolicy

FAST = RetryPolicy(first_delay_s=0.0, cap_s=0.0, max_tries=4)


class Plane:
    """Stands in for ``httpx.post`` to the control plane: answers with ``statuses`` in turn (an exception is
    raised), then 200 with a token; records every request."""

    def __init__(self, *answers):
        self.answers = list(answers)
        self.requests: list[dict] = []

    def __call__(self, url, json, headers, timeout):
        self.requests.append({"url": url, "json": json, "headers": headers})
        answer = self.answers.pop(0) if self.answers else 200
        if isinstance(answer, Exception):
            raise answer
        request = httpx.Request("POST", url)
        if answer == 200:
            return httpx.Response(200, json={"token": f"jtk_{len(self.requests)}"}, request=request)
        return httpx.Response(answer, json={"detail": "not this attempt's claim code"}, request=request)


def test_a_claim_is_retried_with_one_nonce_through_a_lost_answer_and_5xx(monkeypatch):
    plane = Plane(httpx.ReadTimeout("the answer was lost"), 503)
    monkeypatch.setattr(claim_module.httpx, "post", plane)
    token = claim_token("http://cp:8000/", "sweeps", "s1", 2, "jcl_code", retry=FAST)
    assert token.reveal() == "jtk_3"
    assert [r["url"] for r in plane.requests] == ["http://cp:8000/internal/v1/sweeps/s1/claim"] * 3
    assert {r["headers"]["Authorization"] for r in plane.requests} == {"Bearer jcl_code"}
    nonces = {r["json"]["nonce"] for r in plane.requests}
    assert len(nonces) == 1 and len(nonces.pop()) >= 16  # the retry is the same driver's: the server re-issues
    assert {r["json"]["attempt"] for r in plane.requests} == {2}


def test_a_refused_claim_is_not_retried(monkeypatch):
    plane = Plane(401)
    monkeypatch.setattr(claim_module.httpx, "post", plane)
    with pytest.raises(ClaimRefused, match="job j1 attempt 1"):
        claim_token("http://cp", "jobs", "j1", 1, "jcl_code", retry=FAST)
    assert len(plane.requests) == 1


def test_a_run_token_is_hidden_from_str_repr_and_ray_trains_listing_but_pickles_whole():
    # Ray Train's state API lists a run's train_loop_config by each value's str (a value of a class with its own
    # __str__/__repr__: ray/train/v2/_internal/state/schema.py, _to_json_serializable_value).
    token = RunToken("jtk_secret")
    config = {"token": token, "sweep_control": {"token": token}, "job_id": "j1"}
    shown = json.dumps(config, default=str) + repr(config) + str(token) + f"{token}"
    assert "jtk_secret" not in shown
    assert pickle.loads(pickle.dumps(token)).reveal() == "jtk_secret"
    assert bearer(token) == bearer("jtk_secret") == {"Authorization": "Bearer jtk_secret"}
    assert reveal(None) == "" and not RunToken("") and token


def test_the_drivers_claim_before_they_import_ray_or_torch():
    """Ray lists the claim code until the driver exchanged it: the entry modules stay light."""
    probe = (
        "import sys, workers.train.driver, workers.tune.driver; "
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('ray', 'torch')); print(heavy)"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.strip() == "[]"


def test_a_driver_without_a_claim_code_exits_misconfigured(monkeypatch):
    from orchestrator_contract.jobs import DriverExit
    from workers.train import driver

    monkeypatch.setenv("ORCHESTRATOR_URL", "http://cp")
    monkeypatch.delenv("ORCHESTRATOR_CLAIM_CODE", raising=False)
    monkeypatch.setenv("ORCHESTRATOR_JOB_TOKEN", "jtk_from_an_old_control_plane")  # never read any more
    assert driver.main(["--job-id", "j1", "--attempt", "1"]) == DriverExit.MISCONFIGURED


def test_a_driver_whose_claim_is_refused_exits_for_a_new_attempt(monkeypatch):
    from workers.train import driver

    monkeypatch.setenv("ORCHESTRATOR_URL", "http://cp")
    monkeypatch.setenv("ORCHESTRATOR_CLAIM_CODE", "jcl_read_by_somebody_else_first")
    monkeypatch.setattr(claim_module.httpx, "post", Plane(401))
    assert driver.main(["--job-id", "j1", "--attempt", "1"]) == driver.CLAIM_REFUSED_EXIT != 0
