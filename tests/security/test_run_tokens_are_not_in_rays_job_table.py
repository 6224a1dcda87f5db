"""Nothing Ray is handed authenticates (docs/security.md, "Run tokens are never in Ray's job table").

A run's token was readable from Ray's job table. The attempt's driver got
``ORCHESTRATOR_JOB_TOKEN`` in its ``runtime_env``, which Ray lists (``JobSubmissionClient.list_jobs()``) to anyone
holding the cluster's Ray token, i.e. to every process on the cluster: with it, another project's code could
report that project's running job SUCCEEDED with a made-up result.

Now Ray is handed a one-use claim code instead (``ORCHESTRATOR_CLAIM_CODE``), which the driver exchanges at its
start for the token (``POST /internal/v1/{jobs|sweeps}/{id}/claim``); nothing Ray is handed authenticates on a
run's ``/internal`` routes, and the code answers once: a second exchange, an old attempt's code or an ended
run's is 401, logged as a warning naming the run and the attempt.

What it proved on the old code (at 5169c62): ``test_nothing_handed_to_ray_authenticates_on_the_runs_routes``
failed with "runtime_env['env_vars']['ORCHESTRATOR_JOB_TOKEN'] of <job>-1 opens GET
/internal/v1/jobs/<job>/assignment?attempt=1: 200"; the claim tests failed at their first step (no
``ORCHESTRATOR_CLAIM_CODE`` handed to Ray: ``KeyError``; no claim route).
"""

from __future__ import annotations

import logging

import pytest

from orchestrator.backend import RunStatus
from tests.unit.api_helpers import (
    ADMIN,
    CLAIM_CODE_ENV,
    auth,
    claim,
    reconcile,
    run_token,
    submission,
    submit,
    tick,
)
from tests.unit.test_sweeps import post_sweep

NONCE = "the-drivers-own-nonce-0001"
ANOTHER_NONCE = "somebody-elses-nonce-0002"


def _strings(value, where: str):
    """Every string in ``value`` (a runtime_env, metadata, an entrypoint), with where it is, and each word of it."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _strings(key, f"{where} key")
            yield from _strings(item, f"{where}[{key!r}]")
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            yield from _strings(item, f"{where}[{i}]")
    elif isinstance(value, str):
        yield where, value
        for word in value.split():
            if word != value:
                yield f"{where} (a word)", word


def handed_to_ray(backend, index: int):
    """Everything the control plane handed Ray with its ``index``-th submission: what Ray lists of the job."""
    submission_id, entrypoint, _ = backend.submitted[index]
    yield from _strings(backend.runtime_envs[index], "runtime_env")
    yield from _strings(backend.metadata[index], "metadata")
    yield from _strings(entrypoint, "entrypoint")
    yield from _strings(submission_id, "submission_id")


def internal_requests(client, submission_id: str, entrypoint: str):
    """The run's routes that a token opens, each as a call taking the bearer credential."""
    run_id, attempt = submission_id.rsplit("-", 1)
    collection = "sweeps" if "--sweep-id" in entrypoint else "jobs"
    base = f"/internal/v1/{collection}/{run_id}"
    return {
        f"GET {base}/assignment?attempt={attempt}": lambda secret: client.get(
            f"{base}/assignment", params={"attempt": attempt}, headers=auth(secret)
        ),
        f"GET {base}/control?attempt={attempt}": lambda secret: client.get(
            f"{base}/control", params={"attempt": attempt}, headers=auth(secret)
        ),
        f"POST {base}/events": lambda secret: client.post(
            f"{base}/events",
            json={"attempt": int(attempt), "events": [{"type": "state", "state": "running"}]},
            headers=auth(secret),
        ),
    }


def _started(app, client, backend) -> list[int]:
    """A running job and a running sweep: the indexes of their submissions."""
    job = submit(client, ADMIN, scaling={"num_workers": 1, "cpus_per_worker": 1})
    sweep = post_sweep(client, max_concurrent_trials=1)
    assert job.status_code == 201 and sweep.status_code == 201, (job.text, sweep.text)
    tick(app)
    assert len(backend.submitted) == 2
    return [0, 1]


def _opens(client, backend, index: int) -> list[str]:
    submission_id, entrypoint, _ = backend.submitted[index]
    opened = []
    for where, secret in handed_to_ray(backend, index):
        for route, call in internal_requests(client, submission_id, entrypoint).items():
            answer = call(secret)
            if answer.status_code != 401:
                opened.append(f"{where} of {submission_id} opens {route}: {answer.status_code}")
    return opened


def test_nothing_handed_to_ray_authenticates_on_the_runs_routes(app, client, backend):
    submissions = _started(app, client, backend)
    opened = [line for i in submissions for line in _opens(client, backend, i)]
    assert not opened, "\n".join(opened)
    # The drivers claim their tokens: the codes Ray lists open nothing either, and the tokens are not among them.
    for i in submissions:
        submission_id = backend.submitted[i][0]
        token = run_token(client, backend, submission_id)
        assert all(token not in secret for _, secret in handed_to_ray(backend, i))
        route, call = next(iter(internal_requests(client, submission_id, backend.submitted[i][1]).items()))
        assert call(token).status_code == 200, route
    opened = [line for i in submissions for line in _opens(client, backend, i)]
    assert not opened, "\n".join(opened)


def test_a_claim_code_is_exchanged_once_a_second_exchange_is_401_and_logged(app, client, backend, caplog):
    _started(app, client, backend)
    for index in (0, 1):
        submitted = backend.submitted[index]
        submission_id, entrypoint, env = submitted
        run_id, attempt = submission_id.rsplit("-", 1)
        kind = "sweep" if "--sweep-id" in entrypoint else "job"
        first = claim(client.post, submitted, NONCE)
        assert first.status_code == 200, first.text
        token = first.json()["token"]
        assignment, *_ = internal_requests(client, submission_id, entrypoint).values()
        assert assignment(token).status_code == 200

        caplog.clear()
        with caplog.at_level(logging.WARNING):
            second = claim(client.post, submitted, ANOTHER_NONCE)  # the code read from Ray, used by someone else
        assert second.status_code == 401, second.text
        assert second.json() == {"detail": "not this attempt's claim code"}
        warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any(f"{kind} {run_id} attempt {attempt}" in m and "exchanged already" in m for m in warned), warned
        assert assignment(token).status_code == 200  # the driver's own token goes on working

        # The driver itself retrying (its answer lost after the commit): a new token, the lost one revoked.
        again = claim(client.post, submitted, NONCE)
        assert again.status_code == 200, again.text
        assert assignment(again.json()["token"]).status_code == 200
        assert assignment(token).status_code == 401
        assert env[CLAIM_CODE_ENV] not in (token, again.json()["token"])


def test_an_old_attempts_code_and_an_ended_runs_code_are_401_and_logged(app, client, backend, caplog):
    job = submit(client, ADMIN).json()["id"]
    tick(app)
    first_attempt = submission(backend, f"{job}-1")
    backend.runs[f"{job}-1"] = RunStatus.FAILED  # the driver died before it claimed: a new attempt
    reconcile(app)
    assert backend.submitted[-1][0] == f"{job}-2"
    with caplog.at_level(logging.WARNING):
        stale = claim(client.post, first_attempt, NONCE)
    assert stale.status_code == 401, stale.text
    assert any(f"job {job}" in r.getMessage() and "attempt 2" in r.getMessage() for r in caplog.records), caplog.text

    second_attempt = submission(backend, f"{job}-2")
    assert client.post(f"/v1/jobs/{job}/cancel", headers=auth(ADMIN)).status_code == 200
    reconcile(app)
    assert client.get(f"/v1/jobs/{job}", headers=auth(ADMIN)).json()["state"] == "CANCELLED"
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        ended = claim(client.post, second_attempt, NONCE)
    assert ended.status_code == 401, ended.text
    assert any(f"job {job} attempt 2" in r.getMessage() and "CANCELLED" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("field", ["attempt", "nonce"])
def test_a_claim_is_bound_to_its_attempt_and_a_nonce_of_the_drivers_own(app, client, backend, field):
    job = submit(client, ADMIN).json()["id"]
    tick(app)
    submission_id, _, env = submission(backend)
    body = {"attempt": 1, "nonce": NONCE, **({"attempt": 2} if field == "attempt" else {"nonce": "short"})}
    answer = client.post(f"/internal/v1/jobs/{job}/claim", json=body, headers=auth(env[CLAIM_CODE_ENV]))
    assert answer.status_code == (401 if field == "attempt" else 422), answer.text
    assert claim(client.post, submission(backend, submission_id), NONCE).status_code == 200  # still unclaimed
