"""A property-based fuzz of the whole REST API from its own OpenAPI schema (schemathesis over the
unit-test app and the fake cluster, SQLite): as a member and as a viewer of a project, every operation gets
generated requests, valid and not; none may answer a 5xx or a body that breaks the schema it documents.
Bounded: a few examples per operation (ORCHESTRATOR_FUZZ_EXAMPLES, default 30), well under a few minutes."""

from __future__ import annotations

import os

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

from api.app import create_app
from orchestrator.settings import Settings
from tests.fakes import FakeBackend
from tests.unit.api_helpers import ADMIN, auth, make_project

EXAMPLES = int(os.environ.get("ORCHESTRATOR_FUZZ_EXAMPLES", "30"))
KEYS: dict[str, str] = {}


@pytest.fixture
def fuzzed_app(tmp_path):
    app = create_app(
        Settings(
            database_url=f"sqlite:///{tmp_path / 'fuzz.db'}",
            storage=str(tmp_path / "storage"),
            var_dir=str(tmp_path / "var"),
            admin_token=ADMIN,
        ),
        backend=FakeBackend(),
        run_loops=False,
    )
    with TestClient(app) as client:
        _, keys = make_project(client, "fuzz")
        KEYS.update(keys)
        # Something to find: a job, so that job routes see a real id now and then.
        client.post("/v1/jobs", json={"workload": "digits", "epochs": 1}, headers=auth(keys["member"]))
        yield app


@pytest.mark.parametrize("role", ["member", "viewer"])
def test_no_request_makes_the_api_fail_or_break_its_schema(fuzzed_app, role):
    # Each operation's strategy driven by hypothesis here (schemathesis' pytest plugin does not run on
    # this pytest); every failing operation is listed, not only the first.
    schema = schemathesis.openapi.from_asgi("/openapi.json", fuzzed_app)
    failures: dict[str, str] = {}
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) > 30  # the whole API, not an empty schema

    for operation in operations:

        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            derandomize=True,
            database=None,
        )
        @given(case=operation.as_strategy())
        def fuzz(case) -> None:
            if case.path.endswith("/logs") and "follow" in (case.query or {}):
                case.query = {
                    k: v for k, v in case.query.items() if k != "follow"
                }  # a follow streams until its job ends
            case.call_and_validate(headers=auth(KEYS[role]), checks=[not_a_server_error, response_schema_conformance])

        try:
            fuzz()
        except (Exception, BaseExceptionGroup) as exc:
            failures[f"{operation.method.upper()} {operation.path}"] = str(exc)[:2000]
    assert not failures, "\n\n".join(f"{name}:\n{problem}" for name, problem in failures.items())
