"""Every error class of the SDK from a real answer of the unit-test app over HTTP (``live``): 401, 403, 404,
409, 422 (field errors kept, and a message), 429 from the log-follow cap; each with the request id."""

from __future__ import annotations

import re

import pytest

from orchestrator_client import (
    AuthError,
    Conflict,
    NotFound,
    OrchestratorError,
    PermissionDenied,
    RateLimited,
    Unauthenticated,
    ValidationFailed,
)
from tests.unit.sdk_helpers import report, running, sdk, state


@pytest.fixture
def settings_overrides() -> dict:
    return {"max_log_follows_per_key": 1, "log_follow_poll_s": 0.05}


def test_401_an_unknown_key(live):
    with pytest.raises(Unauthenticated) as error:
        sdk(live, token="not-a-key").jobs.list().first()
    assert isinstance(error.value, AuthError) and isinstance(error.value, OrchestratorError)
    assert error.value.status_code == 401 and error.value.method == "GET" and error.value.url == "/v1/jobs"
    assert str(error.value).startswith("401 GET /v1/jobs: ")
    assert re.fullmatch(r"[0-9a-f]{32}", error.value.request_id)


def test_403_a_viewer_key_submits_and_the_request_id_is_the_one_sent(live):
    admin = sdk(live)
    project = admin.projects.create("vision")
    viewer = sdk(live, token=admin.projects.keys(project.id).create("viewer").key)
    sent = []
    viewer.transport.http.event_hooks["request"].append(lambda request: sent.append(request.headers["X-Request-ID"]))
    with pytest.raises(PermissionDenied) as error:
        viewer.jobs.submit({"workload": "digits"})
    assert error.value.status_code == 403 and "viewer" in error.value.message.lower()
    assert error.value.request_id == sent[-1]  # the server answered with the id the client sent
    assert f"(request id {sent[-1]})" in str(error.value)


def test_404_and_409(live):
    client = sdk(live)
    with pytest.raises(NotFound) as missing:
        client.trials.get("no-such-trial")
    assert missing.value.status_code == 404 and missing.value.detail == "no trial no-such-trial"
    client.projects.create("taken")
    with pytest.raises(Conflict) as taken:
        client.projects.create("taken")
    assert taken.value.status_code == 409 and "already exists" in str(taken.value)


def test_422_keeps_the_field_errors(live):
    with pytest.raises(ValidationFailed) as error:
        sdk(live).jobs.submit({"workload": "digits", "epochs": 0, "bogus": 1})
    failed = error.value
    assert failed.status_code == 422 and isinstance(failed.detail, list)
    locs = {tuple(field.loc) for field in failed.field_errors}
    assert ("body", "epochs") in locs and ("body", "bogus") in locs
    assert all(field.msg and field.type for field in failed.field_errors)
    assert "epochs: " in str(failed) and "bogus: " in str(failed)  # one line, field by field, without "body"


def test_422_with_a_message_has_no_field_errors(live):
    client = sdk(live)
    with pytest.raises(ValidationFailed) as error:
        client.transport.request("GET", "/v1/jobs", params={"cursor": "not-a-cursor"})
    assert error.value.field_errors == [] and isinstance(error.value.detail, str)


def test_429_past_the_log_follow_cap_with_its_retry_after(live):
    client = sdk(live)
    job = client.jobs.submit({"workload": "digits"})
    token = running(live, job.id)
    following = job.logs(follow=True)
    assert next(following) == f"log of {job.id}-1"  # the one follow this key may hold is open
    try:
        with pytest.raises(RateLimited) as error:
            next(job.logs(follow=True))
        assert error.value.status_code == 429 and error.value.retry_after == 5
        assert "ORCHESTRATOR_MAX_LOG_FOLLOWS_PER_KEY" in str(error.value)
    finally:
        report(live, job.id, token, state("succeeded"))
        following.close()
