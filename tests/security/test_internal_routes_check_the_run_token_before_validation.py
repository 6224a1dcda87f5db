"""The run's credential is checked before validation on ``/internal`` (docs/security.md, "Route coverage").

The ``/internal/v1`` routes checked the run's token inside the route, after FastAPI had
validated the parameters and the body, so a request bearing another run's token (or a made-up one) and a missing
or invalid parameter, or a body FastAPI could not parse, was a 422 that described the route's parameters.

Now the token (for a claim: the attempt's claim code) is a dependency every such route runs first
(``api.run_auth.RunCaller``), and ``api.auth_first`` runs the same check before a body FastAPI cannot parse is
answered: without the run's own credential the answer is 401, whatever else is wrong with the request; with it,
the 422 says what to fix.

What it proved on the old code (at 5169c62): "GET /internal/v1/jobs/{id}/assignment with another run's token,
no attempt: 422 {"detail":[{"type":"missing","loc":["query","attempt"],...}]} (want 401)", the same on the other
five routes ("POST .../events with another run's token, malformed JSON: 422 json_invalid"), and the claim routes
did not exist (404).
"""

from __future__ import annotations

from tests.unit.api_helpers import ADMIN, CLAIM_CODE_ENV, auth, run_token, submission, submit, tick
from tests.unit.test_sweeps import post_sweep

MALFORMED = '{"attempt": 1, "events": ['


def _runs(app, client, backend) -> dict[str, tuple[str, str, str]]:
    """A running job, another running job and a running sweep: kind -> (collection, id, its token); plus each one's
    unexchanged claim code under "<kind> claim"."""
    one_cpu = {"num_workers": 1, "cpus_per_worker": 1}
    ids = {
        "job": submit(client, ADMIN, scaling=one_cpu).json()["id"],
        "other": submit(client, ADMIN, scaling=one_cpu).json()["id"],
        "sweep": post_sweep(client, max_concurrent_trials=1).json()["id"],
    }
    tick(app)
    runs = {}
    for kind, run_id in ids.items():
        collection = "sweeps" if kind == "sweep" else "jobs"
        code = submission(backend, f"{run_id}-1")[2][CLAIM_CODE_ENV]
        runs[kind] = (collection, run_id, run_token(client, backend, f"{run_id}-1"))
        runs[f"{kind} claim"] = (collection, run_id, code)
    return runs


def _requests(collection: str, run_id: str) -> dict[str, tuple[str, str, dict, dict]]:
    """route -> (method, path, a valid request, an invalid one) for every /internal route of the run."""
    base = f"/internal/v1/{collection}/{run_id}"
    return {
        f"GET {base}/assignment": ("GET", f"{base}/assignment", {"params": {"attempt": 1}}, {}),
        f"GET {base}/control": ("GET", f"{base}/control", {"params": {"attempt": "x"}}, {}),
        f"POST {base}/events": ("POST", f"{base}/events", {"json": {"attempt": 1, "events": []}}, {"json": [1]}),
        f"POST {base}/claim": ("POST", f"{base}/claim", {"json": {"attempt": 1, "nonce": "n" * 20}}, {"json": {}}),
    }


def test_without_the_runs_own_credential_every_internal_route_is_401_before_it_validates(app, client, backend):
    runs = _runs(app, client, backend)
    failures = []
    for kind in ("job", "sweep"):
        collection, run_id, token = runs[kind]
        code = runs[f"{kind} claim"][2]
        for route, (method, path, valid, invalid) in _requests(collection, run_id).items():
            own = code if route.endswith("/claim") else token
            foreign = {
                "another run's token": runs["other"][2],
                "another run's claim code": runs["other claim"][2],
                "the run's token at its claim" if route.endswith("/claim") else "the run's claim code": (
                    token if route.endswith("/claim") else code
                ),
                "a made-up token": "jtk_made-up",
                "an admin key": ADMIN,
            }
            bodies = {"invalid": invalid, "no parameters or body": {}}
            if method == "POST":
                bodies["malformed JSON"] = {"content": MALFORMED, "headers": {"content-type": "application/json"}}
            for who, secret in foreign.items():
                for what, request in bodies.items():
                    headers = {**request.get("headers", {}), **auth(secret)}
                    answer = client.request(method, path, **{**request, "headers": headers})
                    if answer.status_code != 401:
                        failures.append(f"{route} with {who}, {what}: {answer.status_code} {answer.text[:160]}")
            # The run's own credential with the same invalid request: the 422 says what to fix.
            answer = client.request(method, path, **invalid, headers=auth(own))
            if answer.status_code != 422:
                failures.append(f"{route} with its own credential, invalid: {answer.status_code} (want 422)")
            del valid
    assert not failures, "\n".join(failures)
