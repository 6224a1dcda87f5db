"""Every route answers only the caller it is for: a walk over the app's routes (docs/security.md, "Route coverage").

``ROUTES`` names every route of the app with its gate (an API key, a run's own token, a dashboard session, or
none, said why) and what a caller of another project gets (``Across``). A route the table does not name fails
``test_the_table_names_every_route`` ("add it to the table"), so a new route is checked from the day it is
added: listed with a gate it does not have, it fails the test of that gate. Per gate:

- an API key: no key, an unknown key or a run's token is 401, and so is a request with no key whose body and
  parameters are invalid (authentication comes before validation: a 422 would describe the route's
  parameters to anyone). With project B's key: project A's objects are 404 (as a made-up id is), a
  cluster-wide admin's route is 403 (as for a made-up id), a create lands in B (A neither reads nor lists
  it), a list shows none of A's ids;
- a run's token (``/internal/v1``): no token, another run's token or an API key is 401, before validation too;
- a dashboard session: without one a page redirects to the sign-in page and ``/ui/api`` is 401 (a bearer key
  is no session), before validation too; with project B's session A's objects are 404, lists show none of
  A's ids.

Before it, four routes' 401 were checked by hand (``tests/unit/test_api.py::
test_health_needs_no_key_but_everything_else_does``), a few more in the dashboard's and identity's tests.

What it proved on the old code (at 469a44c, before api/auth_first.py):

- ``test_without_a_key_every_api_route_is_401_before_it_validates``: an unauthenticated request with a
  malformed JSON body was a 422 (FastAPI parses a JSON body before it runs any dependency, the key check
  included) on the nine /v1 routes that take JSON: ``POST /v1/jobs with no key, malformed JSON: 422
  '{"detail":[{"type":"json_invalid",...}]}' (want 401)``, and ``POST /ui/api/deployments/{ref}/try`` with no
  session the same (``test_without_a_session_the_dashboard_...``). Now a validation error is answered only
  once the route's own check of its caller passed (``api/auth_first.py``);
- ``test_the_internal_routes_answer_only_the_runs_own_token``: the six /internal/v1 routes answered a request
  with no token, or another run's, and a missing or invalid parameter with a 422 naming it: ``GET
  /internal/v1/jobs/{job_id}/assignment with no token, invalid: 422 '{"detail":[{"type":"missing","loc":
  ["query","attempt"],...}]}' (want 401)``. api/auth_first.py answers those with no token at all 401; another
  run's token is the routes' own check to run first: now a dependency every /internal route runs before FastAPI
  validates anything (``api/run_auth.py``), which api/auth_first.py also runs for a body FastAPI cannot parse
  (``tests/security/test_internal_routes_check_the_run_token_before_validation.py``).
- The claim routes (a driver exchanges its attempt's one-use claim code for the run's token:
  docs/security.md, "Run tokens are never in Ray's job table") have a gate of their own, the claim code:
  ``test_the_claim_routes_answer_only_the_attempts_claim_code``.
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

import pytest
from fastapi import params
from fastapi.routing import iter_route_contexts
from fastapi.testclient import TestClient
from starlette.routing import Mount

from api.ui.session import SESSION_COOKIE
from tests.security.helpers import make_key
from tests.unit.api_helpers import ADMIN, CLAIM_CODE_ENV, auth, blame_node, make_project, submission, submit, tick
from tests.unit.code_archives import TRAIN_PY, zip_of
from tests.unit.test_deployments import finished_job
from tests.unit.test_sweeps import driver_token, post_sweep
from tests.unit.test_ui_sweeps import make_sweep
from tests.unit.ui_helpers import csrf, job_in, signed_in


class Gate(Enum):
    NONE = "none: public"
    KEY = "an API key (Authorization: Bearer)"
    RUN_TOKEN = "the run's own token"
    CLAIM_CODE = "the attempt's one-use claim code (a driver's claim of its run's token)"
    SESSION = "a dashboard session cookie"


class Across(Enum):
    """What a caller of project B gets from a route, given project A's objects."""

    NOT_FOUND = "404: A's object, answered as a made-up id is (its existence is not revealed)"
    CLUSTER_ADMIN = "403 for every project's key, the same answer as for a made-up id"
    CREATES_OWN = "made in B's own project: A neither reads it nor lists it; A's objects named in it are 4xx"
    OWN_ONLY = "B's own project only: none of A's ids in the answer"
    SAME_FOR_ALL = "computed from the request alone (no project's data): the same answer for A and B"


Send = Callable[[dict], dict]  # the path's ids -> the keyword arguments of the request (json=, data=, files=)


def _nothing(_: dict) -> dict:
    return {}


@dataclass(frozen=True)
class Expect:
    gate: Gate
    across: Across | None = None
    why: str = ""  # a public route: why it needs no key
    send: Send = _nothing  # a valid request's body
    read_back: str = ""  # CREATES_OWN: where the made object is read ("{id}": its id)
    foreign: tuple[Send, ...] = ()  # CREATES_OWN: bodies naming A's objects, answered as for made-up ids


def public(why: str) -> Expect:
    return Expect(Gate.NONE, why=why)


def key(across: Across, **kwargs: Any) -> Expect:
    return Expect(Gate.KEY, across, **kwargs)


def page(across: Across, **kwargs: Any) -> Expect:
    return Expect(Gate.SESSION, across, **kwargs)


RUN = Expect(Gate.RUN_TOKEN)
CLAIM = Expect(Gate.CLAIM_CODE)
NOT_FOUND, CLUSTER_ADMIN, CREATES_OWN, OWN_ONLY, SAME_FOR_ALL = (
    Across.NOT_FOUND,
    Across.CLUSTER_ADMIN,
    Across.CREATES_OWN,
    Across.OWN_ONLY,
    Across.SAME_FOR_ALL,
)
PLAN = {"params": 2e9, "precision": "bf16", "optimizer": "adam", "gpus": 8, "gpu_memory_gb": 16, "activation_gb": 3}
SCHEMA_VIEWER = "the API's schema or a viewer of it: the same for everyone, no project's data"


def _b_code(_: dict) -> dict:  # other bytes than A's package: a package's id is its digest
    return {"files": {"file": ("code.zip", zip_of({"train.py": TRAIN_PY, "b.py": b"B = 1\n"}))}}


ROUTES: dict[tuple[str, str], Expect] = {
    ("GET", "/openapi.json"): public(SCHEMA_VIEWER),
    ("GET", "/docs"): public(SCHEMA_VIEWER),
    ("GET", "/docs/oauth2-redirect"): public(SCHEMA_VIEWER),
    ("GET", "/redoc"): public(SCHEMA_VIEWER),
    ("GET", "/healthz"): public("the liveness probe: the process answers"),
    ("GET", "/readyz"): public("the readiness probe: the database and Ray answer"),
    ("GET", "/v1/whoami"): key(OWN_ONLY),
    ("GET", "/v1/cluster"): key(OWN_ONLY),
    ("DELETE", "/v1/cluster/bad-nodes/{node_id}"): key(CLUSTER_ADMIN),
    ("POST", "/v1/projects"): key(CLUSTER_ADMIN, send=lambda ids: {"json": {"name": "c"}}),
    ("GET", "/v1/projects"): key(OWN_ONLY),
    ("GET", "/v1/projects/{project_id}"): key(NOT_FOUND),
    ("PATCH", "/v1/projects/{project_id}"): key(CLUSTER_ADMIN, send=lambda ids: {"json": {"max_priority": 5}}),
    ("PUT", "/v1/projects/{project_id}/quota"): key(CLUSTER_ADMIN, send=lambda ids: {"json": {"max_cpus": 1}}),
    ("POST", "/v1/projects/{project_id}/keys"): key(NOT_FOUND, send=lambda ids: {"json": {"role": "member"}}),
    ("GET", "/v1/projects/{project_id}/keys"): key(NOT_FOUND),
    ("DELETE", "/v1/projects/{project_id}/keys/{key_id}"): key(NOT_FOUND),
    ("PUT", "/v1/projects/{project_id}/clusters"): key(CLUSTER_ADMIN, send=lambda ids: {"json": {"clusters": ["c"]}}),
    ("GET", "/v1/projects/{project_id}/clusters"): key(NOT_FOUND),
    ("POST", "/v1/clusters"): key(CLUSTER_ADMIN, send=lambda ids: {"json": {"name": "c", "address": "http://c:8265"}}),
    ("GET", "/v1/clusters"): key(CLUSTER_ADMIN),
    ("GET", "/v1/clusters/{name}"): key(CLUSTER_ADMIN),
    ("PATCH", "/v1/clusters/{name}"): key(CLUSTER_ADMIN, send=lambda ids: {"json": {"labels": {"gpu": "a100"}}}),
    ("DELETE", "/v1/clusters/{name}"): key(CLUSTER_ADMIN),
    ("POST", "/v1/jobs"): key(
        CREATES_OWN,
        send=lambda ids: {"json": {"workload": "digits"}},
        read_back="/v1/jobs/{id}",
        foreign=(lambda ids: {"json": {"workload": "train:build", "code": {"id": ids["package_id"]}}},),
    ),
    ("GET", "/v1/jobs"): key(OWN_ONLY),
    ("GET", "/v1/jobs/{job_id}"): key(NOT_FOUND),
    ("POST", "/v1/jobs/{job_id}/cancel"): key(NOT_FOUND),
    ("GET", "/v1/jobs/{job_id}/events"): key(NOT_FOUND),
    ("GET", "/v1/jobs/{job_id}/metrics"): key(NOT_FOUND),
    ("GET", "/v1/jobs/{job_id}/checkpoints"): key(NOT_FOUND),
    ("GET", "/v1/jobs/{job_id}/goodput"): key(NOT_FOUND),
    ("GET", "/v1/jobs/{job_id}/logs"): key(NOT_FOUND),
    ("POST", "/v1/code"): key(CREATES_OWN, send=_b_code, read_back="/v1/code/{id}"),
    ("GET", "/v1/code"): key(OWN_ONLY),
    ("GET", "/v1/code/{package_id}"): key(NOT_FOUND),
    ("POST", "/v1/sweeps"): key(
        CREATES_OWN,
        send=lambda ids: {"json": SWEEP},
        read_back="/v1/sweeps/{id}",
        foreign=(lambda ids: {"json": {**SWEEP, "base": {**SWEEP["base"], "code": {"id": ids["package_id"]}}}},),
    ),
    ("GET", "/v1/sweeps"): key(OWN_ONLY),
    ("GET", "/v1/sweeps/{sweep_id}"): key(NOT_FOUND),
    ("GET", "/v1/sweeps/{sweep_id}/trials"): key(NOT_FOUND),
    ("GET", "/v1/sweeps/{sweep_id}/events"): key(NOT_FOUND),
    ("GET", "/v1/sweeps/{sweep_id}/logs"): key(NOT_FOUND),
    ("POST", "/v1/sweeps/{sweep_id}/cancel"): key(NOT_FOUND),
    ("GET", "/v1/trials/{trial_id}"): key(NOT_FOUND),
    ("GET", "/v1/trials/{trial_id}/metrics"): key(NOT_FOUND),
    ("GET", "/v1/trials/{trial_id}/events"): key(NOT_FOUND),
    ("POST", "/v1/deployments"): key(
        CREATES_OWN,
        send=lambda ids: {"json": {"name": "dep-b", "source": {"job_id": ids["b_job_id"]}}},
        read_back="/v1/deployments/{name}",
        foreign=(
            lambda ids: {"json": {"name": "dep-c", "source": {"job_id": ids["job_id"]}}},
            lambda ids: {"json": {"name": "dep-c", "source": {"trial_id": ids["trial_id"]}}},
            lambda ids: {"json": {"name": "dep-c", "source": {"checkpoint_id": ids["checkpoint_id"]}}},
        ),
    ),
    ("GET", "/v1/deployments"): key(OWN_ONLY),
    ("GET", "/v1/deployments/{name}"): key(NOT_FOUND),
    ("GET", "/v1/deployments/{name}/events"): key(NOT_FOUND),
    ("PATCH", "/v1/deployments/{name}"): key(NOT_FOUND, send=lambda ids: {"json": {"replicas": 2}}),
    ("POST", "/v1/deployments/{name}/rollback"): key(NOT_FOUND),
    ("DELETE", "/v1/deployments/{name}"): key(NOT_FOUND),
    ("POST", "/v1/plan"): key(SAME_FOR_ALL, send=lambda ids: {"json": PLAN}),
    ("GET", "/v1/usage"): key(OWN_ONLY),
    ("GET", "/metrics"): key(CLUSTER_ADMIN),  # ORCHESTRATOR_METRICS=admin, the default
    ("GET", "/internal/v1/jobs/{job_id}/assignment"): RUN,
    ("GET", "/internal/v1/jobs/{job_id}/control"): RUN,
    ("POST", "/internal/v1/jobs/{job_id}/events"): RUN,
    ("GET", "/internal/v1/sweeps/{sweep_id}/assignment"): RUN,
    ("GET", "/internal/v1/sweeps/{sweep_id}/control"): RUN,
    ("POST", "/internal/v1/sweeps/{sweep_id}/events"): RUN,
    ("POST", "/internal/v1/jobs/{job_id}/claim"): CLAIM,
    ("POST", "/internal/v1/sweeps/{sweep_id}/claim"): CLAIM,
    ("GET", "/ui"): public("a redirect to /ui/jobs, which needs a session"),
    ("GET", "/ui/login"): public("the sign-in form, where a key is given"),
    ("POST", "/ui/login"): public("the sign-in form's post: it checks the key it is given"),
    ("MOUNT", "/ui/static"): public("the dashboard's own scripts and styles, the same for everyone"),
    ("POST", "/ui/logout"): page(OWN_ONLY),  # ends the caller's own session only
    ("POST", "/ui/project"): page(CLUSTER_ADMIN, send=lambda ids: {"data": {"project_id": ids["project_id"]}}),
    ("GET", "/ui/jobs"): page(OWN_ONLY),
    ("GET", "/ui/jobs/{job_id}"): page(NOT_FOUND),
    ("POST", "/ui/jobs/{job_id}/cancel"): page(NOT_FOUND),
    ("POST", "/ui/jobs/{job_id}/checkpoints/{checkpoint_id}/deploy"): page(
        NOT_FOUND, send=lambda ids: {"data": {"name": "stolen"}}
    ),
    ("GET", "/ui/jobs/{job_id}/logs/download"): page(NOT_FOUND),
    ("GET", "/ui/api/jobs"): page(OWN_ONLY),
    ("GET", "/ui/api/jobs/{job_id}"): page(NOT_FOUND),
    ("GET", "/ui/api/jobs/{job_id}/metrics"): page(NOT_FOUND),
    ("GET", "/ui/api/jobs/{job_id}/logs"): page(NOT_FOUND),
    ("GET", "/ui/sweeps"): page(OWN_ONLY),
    ("GET", "/ui/sweeps/{sweep_id}"): page(NOT_FOUND),
    ("POST", "/ui/sweeps/{sweep_id}/deploy"): page(
        NOT_FOUND, send=lambda ids: {"data": {"name": "stolen", "trial_id": ids["trial_id"]}}
    ),
    ("POST", "/ui/sweeps/{sweep_id}/cancel"): page(NOT_FOUND),
    ("GET", "/ui/api/sweeps"): page(OWN_ONLY),
    ("GET", "/ui/api/sweeps/{sweep_id}"): page(NOT_FOUND),
    ("GET", "/ui/deployments"): page(OWN_ONLY),
    ("GET", "/ui/deployments/{ref}"): page(NOT_FOUND),
    ("POST", "/ui/deployments/{ref}/rollback"): page(NOT_FOUND),
    ("GET", "/ui/api/deployments"): page(OWN_ONLY),
    ("GET", "/ui/api/deployments/{ref}"): page(NOT_FOUND),
    ("POST", "/ui/api/deployments/{ref}/try"): page(NOT_FOUND, send=lambda ids: {"json": {"body": "{}"}}),
    ("GET", "/ui/cluster"): page(OWN_ONLY),
    ("GET", "/ui/api/cluster"): page(OWN_ONLY),
}
SWEEP = {
    "base": {"workload": "digits"},
    "search_space": {"lr.base": {"type": "loguniform", "low": 1e-3, "high": 0.3}},
}


# --- the app's routes ------------------------------------------------------------------------------------------


def app_routes(app) -> dict[tuple[str, str], Any]:
    """(method, path) -> the route, for every route the app answers (HEAD, which Starlette adds to a GET, left
    out; a mounted app is ("MOUNT", its path))."""
    found: dict[tuple[str, str], Any] = {}
    for route in iter_route_contexts(app.routes):
        if isinstance(route.original_route, Mount):
            found[("MOUNT", route.path)] = route
            continue
        for method in route.methods or ():
            if method != "HEAD" or "GET" not in route.methods:
                found[(method, route.path)] = route
    return found


def table(gate: Gate) -> Iterator[tuple[str, str, Expect]]:
    for (method, path), expect in ROUTES.items():
        if expect.gate == gate:
            yield method, path, expect


# --- project A's objects, B's keys -----------------------------------------------------------------------------


@dataclass
class World:
    ids: dict[str, Any]  # path parameters: project A's objects (and b_job_id, B's own finished job)
    ghost_ids: dict[str, Any]  # the same names, made up: no such object anywhere
    run_ids: dict[str, str]  # the /internal routes' job_id and sweep_id: A's running job and sweep
    run_tokens: dict[str, str]  # "job", "sweep": their own tokens; "other_job": another running job's
    a: dict[str, str]  # role -> key of project A ("admin" included)
    b: dict[str, str]  # the same of project B
    secrets: list[str] = field(default_factory=list)  # A's ids: none may show in an answer to B


@pytest.fixture
def world(app, client, backend, tmp_path) -> World:
    a, a_keys = make_project(client, "a")
    b, b_keys = make_project(client, "b")
    a_admin, b_admin = make_key(client, a, "admin"), make_key(client, b, "admin")
    a_keys["admin"], b_keys["admin"] = a_admin["key"], b_admin["key"]
    one_cpu = {"num_workers": 1, "cpus_per_worker": 1}
    running_job = submit(client, a_keys["member"], scaling=one_cpu).json()["id"]
    other_job = submit(client, a_keys["member"], scaling=one_cpu).json()["id"]
    running_sweep = post_sweep(client, a_keys["member"], max_concurrent_trials=1)
    assert running_sweep.status_code == 201, running_sweep.text
    running_sweep = running_sweep.json()["id"]
    tick(app)
    job_token, other_token, sweep_token = (
        driver_token(client, backend, f"{run}-1")["Authorization"].removeprefix("Bearer ")
        for run in (running_job, other_job, running_sweep)
    )
    queued = job_in(app, a, name="queued-a")  # after the ticks: it stays queued (the cluster view lists it)
    job, checkpoints = finished_job(app, tmp_path / "a", a)
    b_job, _ = finished_job(app, tmp_path / "b", b)
    sweep = make_sweep(app, tmp_path / "sweep", a, "search-a")
    made = client.post(
        "/v1/deployments", json={"name": "dep-a", "source": {"job_id": job}}, headers=auth(a_keys["member"])
    )
    assert made.status_code == 201, made.text
    package = client.post(
        "/v1/code", files={"file": ("code.zip", zip_of({"train.py": TRAIN_PY}))}, headers=auth(a_keys["member"])
    )
    assert package.status_code == 201, package.text
    blame_node(
        app.state.service.sessions, "node-bad-a", job
    )  # a bad node whose faults name A's job: B must not see the job
    ids = {
        "node_id": "node-bad-a",
        "project_id": a,
        "key_id": a_admin["id"],
        "job_id": job,
        "checkpoint_id": checkpoints[0],
        "package_id": package.json()["id"],
        "sweep_id": sweep["id"],
        "trial_id": sweep["trials"][1],
        "name": "dep-a",
        "ref": "dep-a",
        "b_job_id": b_job,
    }
    ghost_ids = {
        **{name: "0f" * 16 for name in ("project_id", "key_id", "job_id", "sweep_id", "b_job_id")},
        "checkpoint_id": 987654,
        "package_id": "sha256:" + "0" * 64,
        "trial_id": "0f" * 16 + "_00001",
        "name": "dep-ghost",
        "ref": "dep-ghost",
        "node_id": "0f" * 16,
    }
    secrets = [a, a_admin["id"], job, running_job, other_job, running_sweep, queued, sweep["id"], made.json()["id"]]
    secrets += [*sweep["trials"].values(), package.json()["id"], "dep-a", "queued-a", "search-a"]
    return World(
        ids=ids,
        ghost_ids=ghost_ids,
        run_ids={"job_id": running_job, "sweep_id": running_sweep},
        run_tokens={"job": job_token, "sweep": sweep_token, "other_job": other_token},
        a=a_keys,
        b=b_keys,
        secrets=secrets,
    )


# --- requests ----------------------------------------------------------------------------------------------------


def _dependants(dependant) -> Iterator[Any]:
    yield dependant
    for sub in dependant.dependencies:
        yield from _dependants(sub)


def _rejected(model_field) -> str | None:
    """A value the parameter refuses, as a query string or a form field carries it (one value or a list of
    one); None if it takes anything."""
    for candidate in ("!", "-1", "0", "x" * 5000):
        if model_field.validate(candidate)[1] and model_field.validate([candidate])[1]:
            return candidate
    return None


@dataclass(frozen=True)
class Invalid:
    """A request the route refuses as invalid whoever sends it: required parameters left out, the others given
    values they refuse, a body of the wrong shape."""

    params: dict[str, str]
    body: dict[str, Any]
    refused: bool  # something in it is invalid (a route with no parameters and no body has nothing to refuse)


def invalid_request(route) -> Invalid:
    query, body, refused = {}, {}, False
    for dependant in _dependants(route.dependant):
        for param in dependant.query_params:
            if param.field_info.is_required():
                refused = True  # left out
            elif (value := _rejected(param)) is not None:
                query[param.alias], refused = value, True
        for param in dependant.body_params:
            if isinstance(param.field_info, params.Form):
                if param.field_info.is_required():
                    refused = True  # left out
                elif (value := _rejected(param)) is not None:
                    body.setdefault("data", {})[param.alias], refused = value, True
            else:
                body["json"], refused = [1], True  # no model, no embedded body, is a list
    return Invalid(query, body, refused)


def takes_json(route) -> bool:
    return any(
        not isinstance(param.field_info, params.Form)
        for dependant in _dependants(route.dependant)
        for param in dependant.body_params
    )


MALFORMED_JSON = {"content": b'{"workload": ', "headers": {"Content-Type": "application/json"}}


def url(path: str, ids: dict) -> str:
    return path.format(**ids)


def said(answer) -> str:
    """What an answer says, for a message."""
    return f"{answer.status_code} {answer.text[:160]!r}"


def leaked(world: World, answer) -> list[str]:
    return [secret for secret in world.secrets if secret in answer.text]


class _Reading(dict):
    """The ids, noting which of them a request's body reads."""

    def __init__(self, ids: dict) -> None:
        super().__init__(ids)
        self.read: set[str] = set()

    def __getitem__(self, name: str) -> Any:
        self.read.add(name)
        return super().__getitem__(name)


def named_ids(path: str, send: Send, ids: dict) -> dict:
    """The ids a request names: its path's and its body's."""
    reading = _Reading(ids)
    send(reading)
    names = {name for _, name, _, _ in string.Formatter().parse(path) if name} | reading.read
    return {name: ids[name] for name in names}


def same_but_ids(first, second, first_ids: dict, second_ids: dict) -> bool:
    """The two answers say the same once each names the ids of its request as <id>: a made-up id and A's are
    told apart by nothing."""

    def plain(text: str, ids: dict) -> str:
        for value in sorted(ids.values(), key=lambda v: len(str(v)), reverse=True):
            # A number only as a word of a sentence or a path's part ("checkpoint 1", "/1/"): not "scale=1".
            around = (r"(?<=[\s/])", r"(?=[\s/)<\",}])") if isinstance(value, int) else (r"(?<![\w.-])", r"(?![\w.-])")
            text = re.sub(around[0] + re.escape(str(value)) + around[1], "<id>", text)
        return text

    return first.status_code == second.status_code and plain(first.text, first_ids) == plain(second.text, second_ids)


def answered_alike(client, method: str, path: str, expect: Expect, world: World, answer, **options) -> bool:
    """``answer`` (to the request naming A's objects) is what the same request naming made-up ones gets."""
    made_up = client.request(method, url(path, world.ghost_ids), **options, **expect.send(world.ghost_ids))
    return same_but_ids(
        answer,
        made_up,
        named_ids(path, expect.send, world.ids),
        named_ids(path, expect.send, world.ghost_ids),
    ), made_up


# --- the table ---------------------------------------------------------------------------------------------------


def test_the_table_names_every_route(app):
    routes = set(app_routes(app))
    missing = sorted(routes - set(ROUTES))
    gone = sorted(set(ROUTES) - routes)
    assert not missing, (
        f"routes with no line in ROUTES: {missing}: add each to the table with its gate (and, for a public "
        "route, why it needs no key); the other tests then check it"
    )
    assert not gone, f"ROUTES names routes the app no longer has: {gone}: remove them from the table"
    for (method, path), expect in ROUTES.items():
        assert (expect.gate == Gate.NONE) == bool(expect.why), (
            f"{method} {path}: a public route, and only one, says why"
        )
        assert (expect.gate in (Gate.NONE, Gate.RUN_TOKEN, Gate.CLAIM_CODE)) == (expect.across is None), (
            f"{method} {path}"
        )


def test_the_public_routes_answer_without_a_key_and_show_no_projects_data(app, world):
    anonymous = TestClient(app)
    failures = []
    for method, path, _ in table(Gate.NONE):
        if method == "MOUNT":
            method, path = "GET", f"{path}/app.js"
        answer = anonymous.request(method, path, follow_redirects=False)
        if answer.status_code >= 500 or answer.status_code == 401 or leaked(world, answer):
            failures.append(f"{method} {path}: {said(answer)}, shows {leaked(world, answer)}")
    assert not failures, "\n".join(failures)


# --- the REST API: an API key -----------------------------------------------------------------------------------


def test_without_a_key_every_api_route_is_401_before_it_validates(app, client, world):
    routes = app_routes(app)
    failures = []
    for method, path, expect in table(Gate.KEY):
        target = url(path, world.ids)
        invalid = invalid_request(routes[(method, path)])
        tries = {
            "no key": ({}, expect.send(world.ids)),
            "an unknown key": ({"headers": auth("ork_not-a-key")}, expect.send(world.ids)),
            "a run's token": ({"headers": auth(world.run_tokens["job"])}, expect.send(world.ids)),
            "no key, invalid": ({"params": invalid.params}, invalid.body),
        }
        if takes_json(routes[(method, path)]):
            tries["no key, malformed JSON"] = ({}, MALFORMED_JSON)
        for what, (options, body) in tries.items():
            answer = client.request(method, target, **options, **body)
            if answer.status_code != 401 or answer.headers.get("WWW-Authenticate") != "Bearer":
                failures.append(f"{method} {path} with {what}: {said(answer)} (want 401)")
        if invalid.refused:  # the request really is invalid: with a key it is a 422
            answer = client.request(method, target, params=invalid.params, headers=auth(ADMIN), **invalid.body)
            if answer.status_code != 422:
                failures.append(f"{method} {path}: the invalid request with a key: {said(answer)} (want 422)")
    assert not failures, "\n".join(failures)


def test_another_projects_key_finds_none_of_its_objects(app, client, world):
    """B's admin key (its project's every role: no 403 hides a 404) on A's objects, per the route's shape."""
    routes = app_routes(app)
    b, a = auth(world.b["admin"]), auth(world.a["admin"])
    failures = []
    for method, path, expect in table(Gate.KEY):
        target = url(path, world.ids)
        answer = client.request(method, target, headers=b, **expect.send(world.ids))
        if expect.across in (NOT_FOUND, CLUSTER_ADMIN):
            want = 404 if expect.across == NOT_FOUND else 403
            alike, made_up = answered_alike(client, method, path, expect, world, answer, headers=b)
            if answer.status_code != want or not alike:
                failures.append(f"{method} {path}: {said(answer)}, a made-up id {said(made_up)} (want the same {want})")
            if method == "GET" and want == 404 and (own := client.get(target, headers=a)).status_code != 200:
                failures.append(f"{method} {path}: A's own key {said(own)}: the check above proves nothing")
        elif expect.across == OWN_ONLY:
            if answer.status_code != 200 or leaked(world, answer):
                failures.append(f"{method} {path}: {said(answer)} shows A's {leaked(world, answer)}")
        elif expect.across == SAME_FOR_ALL:
            own = client.request(method, target, headers=a, **expect.send(world.ids))
            if answer.status_code != 200 or answer.json() != own.json():
                failures.append(f"{method} {path}: B {said(answer)}, A {said(own)} (want the same 200)")
        elif expect.across == CREATES_OWN:
            failures += _creates_in_own_project(client, method, path, expect, answer, world)
        if "project_id" in {p.alias for d in _dependants(routes[(method, path)].dependant) for p in d.query_params}:
            scoped = client.request(
                method, target, params={"project_id": world.ids["project_id"]}, headers=b, **expect.send(world.ids)
            )
            if scoped.status_code != 404:
                failures.append(f"{method} {path}?project_id=<A's>: {said(scoped)} (want 404)")
    assert not failures, "\n".join(failures)


def _creates_in_own_project(client, method: str, path: str, expect: Expect, answer, world: World) -> list[str]:
    b, a = auth(world.b["admin"]), auth(world.a["admin"])
    if answer.status_code != 201:
        return [f"{method} {path}: B's create {said(answer)} (want 201)"]
    made = answer.json()
    read_back = expect.read_back.format(id=made.get("id"), name=made.get("name"))
    failures = []
    if client.get(read_back, headers=b).status_code != 200:
        failures.append(f"{method} {path}: B cannot read {read_back} it made")
    if (seen := client.get(read_back, headers=a)).status_code != 404:
        failures.append(f"{method} {path}: A reads B's {read_back}: {said(seen)} (want 404)")
    if made["id"] in client.get(path, headers=a).text:
        failures.append(f"{method} {path}: A's list shows B's {made['id']}")
    for send in expect.foreign:
        naming_a = client.request(method, path, headers=b, **send(world.ids))
        alike, naming_none = answered_alike(
            client, method, path, replace(expect, send=send), world, naming_a, headers=b
        )
        if not 400 <= naming_a.status_code < 500 or not alike:
            failures.append(
                f"{method} {path} naming A's object: {said(naming_a)}, a made-up one {said(naming_none)} "
                "(want the same 4xx)"
            )
    return failures


# --- the drivers' routes: a run's own token ----------------------------------------------------------------------


def test_the_internal_routes_answer_only_the_runs_own_token(app, client, world):
    routes = app_routes(app)
    failures = []
    for method, path, _ in table(Gate.RUN_TOKEN):
        kind = "sweep" if "{sweep_id}" in path else "job"
        target = url(path, world.run_ids)
        valid = {"params": {"attempt": 1}} if method == "GET" else {"json": {"attempt": 1, "events": []}}
        own = client.request(method, target, headers=auth(world.run_tokens[kind]), **valid)
        if own.status_code != 200:  # the requests below are right but for their token
            failures.append(f"{method} {path} with its own token: {said(own)} (want 200)")
        others = {"job": world.run_tokens["sweep"], "sweep": world.run_tokens["job"]}
        invalid = invalid_request(routes[(method, path)])
        tries = {
            "no token": ({}, valid),
            "another run's token": ({"headers": auth(world.run_tokens["other_job"])}, valid),
            f"a token of a run that is no {kind}": ({"headers": auth(others[kind])}, valid),
            "an admin key": ({"headers": auth(ADMIN)}, valid),
            "a member key of its project": ({"headers": auth(world.a["member"])}, valid),
            "no token, invalid": ({"params": invalid.params}, invalid.body),
            "another run's token, invalid": (
                {"params": invalid.params, "headers": auth(world.run_tokens["other_job"])},
                invalid.body,
            ),
        }
        if takes_json(routes[(method, path)]):
            tries["no token, malformed JSON"] = ({}, MALFORMED_JSON)
            tries["another run's token, malformed JSON"] = (
                {},
                {**MALFORMED_JSON, "headers": {**MALFORMED_JSON["headers"], **auth(world.run_tokens["other_job"])}},
            )
        for what, (options, body) in tries.items():
            answer = client.request(method, target, **options, **body)
            if answer.status_code != 401:
                failures.append(f"{method} {path} with {what}: {said(answer)} (want 401)")
    assert not failures, "\n".join(failures)


def test_the_claim_routes_answer_only_the_attempts_claim_code(app, client, backend, world):
    """A driver's first request: its attempt's claim code (the one Ray was handed) for the run's token; anything else, a
    run's token included, is 401, before validation too
    (docs/security.md, "Run tokens are never in Ray's job table")."""
    routes = app_routes(app)
    failures = []
    for method, path, _ in table(Gate.CLAIM_CODE):
        kind = "sweep" if "{sweep_id}" in path else "job"
        target = url(path, world.run_ids)
        submitted = submission(backend, f"{world.run_ids[f'{kind}_id']}-1")
        # The driver claimed at its start (the world's run_token); the same driver asking again gets a token.
        valid = {"json": {"attempt": 1, "nonce": f"driver-of-{submitted[0]}"}}
        own = client.request(method, target, headers=auth(submitted[2][CLAIM_CODE_ENV]), **valid)
        if own.status_code != 200:
            failures.append(f"{method} {path} with its own claim code: {said(own)} (want 200)")
        other_code = submission(backend, f"{world.run_ids['sweep_id' if kind == 'job' else 'job_id']}-1")[2]
        invalid = invalid_request(routes[(method, path)])
        tries = {
            "no code": ({}, valid),
            "the run's own token": ({"headers": auth(world.run_tokens[kind])}, valid),
            "another run's claim code": ({"headers": auth(other_code[CLAIM_CODE_ENV])}, valid),
            "an admin key": ({"headers": auth(ADMIN)}, valid),
            "a member key of its project": ({"headers": auth(world.a["member"])}, valid),
            "no code, invalid": ({"params": invalid.params}, invalid.body),
            "the run's own token, invalid": (
                {"params": invalid.params, "headers": auth(world.run_tokens[kind])},
                invalid.body,
            ),
            "no code, malformed JSON": ({}, MALFORMED_JSON),
            "another run's claim code, malformed JSON": (
                {},
                {**MALFORMED_JSON, "headers": {**MALFORMED_JSON["headers"], **auth(other_code[CLAIM_CODE_ENV])}},
            ),
        }
        for what, (options, body) in tries.items():
            answer = client.request(method, target, **options, **body)
            if answer.status_code != 401:
                failures.append(f"{method} {path} with {what}: {said(answer)} (want 401)")
    assert not failures, "\n".join(failures)


# --- the dashboard: a session -----------------------------------------------------------------------------------


def _is_sent_to_sign_in(path: str, answer) -> bool:
    if path.startswith("/ui/api/"):
        return answer.status_code == 401
    return answer.status_code == 303 and answer.headers["location"].startswith("/ui/login?next=")


def test_without_a_session_the_dashboard_redirects_to_sign_in_before_it_validates(app, world):
    routes = app_routes(app)
    anonymous = TestClient(app, follow_redirects=False)
    failures = []
    for method, path, expect in table(Gate.SESSION):
        target = url(path, world.ids)
        invalid = invalid_request(routes[(method, path)])
        tries = {
            "no session": ({}, expect.send(world.ids)),
            "a bearer key, no session": ({"headers": auth(ADMIN)}, expect.send(world.ids)),
            "a forged session cookie": ({"cookies": {SESSION_COOKIE: "forged"}}, expect.send(world.ids)),
            "no session, invalid": ({"params": invalid.params}, invalid.body),
        }
        if takes_json(routes[(method, path)]):
            tries["no session, malformed JSON"] = ({}, MALFORMED_JSON)
        for what, (options, body) in tries.items():
            anonymous.cookies.clear()
            answer = anonymous.request(method, target, **options, **body)
            if not _is_sent_to_sign_in(path, answer):
                want = "401" if path.startswith("/ui/api/") else "303 to /ui/login"
                failures.append(f"{method} {path} with {what}: {said(answer)} (want {want})")
    assert not failures, "\n".join(failures)


def test_another_projects_session_finds_none_of_its_objects(app, world):
    """B's admin key signed in to the dashboard, on A's objects; A's own session shows the pages exist."""
    b_user = signed_in(TestClient(app, follow_redirects=False), world.b["admin"])
    a_user = signed_in(TestClient(app, follow_redirects=False), world.a["admin"])
    token = {"X-CSRF-Token": csrf(b_user)}
    failures = []
    for method, path, expect in table(Gate.SESSION):
        target = url(path, world.ids)
        answer = b_user.request(method, target, headers=token, **expect.send(world.ids))
        if expect.across in (NOT_FOUND, CLUSTER_ADMIN):
            want = 404 if expect.across == NOT_FOUND else 403
            alike, made_up = answered_alike(b_user, method, path, expect, world, answer, headers=token)
            if answer.status_code != want or not alike:
                failures.append(f"{method} {path}: {said(answer)}, a made-up id {said(made_up)} (want the same {want})")
            if method == "GET" and want == 404 and (own := a_user.get(target)).status_code != 200:
                failures.append(f"{method} {path}: A's own session {said(own)}: the check above proves nothing")
        elif expect.across == OWN_ONLY:
            if answer.status_code not in (200, 303) or leaked(world, answer):
                failures.append(f"{method} {path}: {said(answer)} shows A's {leaked(world, answer)}")
            if path == "/ui/logout":  # B signed out: sign in again for the rest
                b_user = signed_in(b_user, world.b["admin"])
                token = {"X-CSRF-Token": csrf(b_user)}
        else:
            failures.append(f"{method} {path}: no check for {expect.across}")
    assert not failures, "\n".join(failures)
