"""How ``orch`` turns each SDK error class into a line and an exit code: 2 for what the caller can fix (401,
403, 404, 409, 422, an ambiguous name), 1 for the rest (429 after the retries, 5xx, no answer)."""

from __future__ import annotations

import pytest

from orchestrator_client.cli import exits
from orchestrator_client.errors import (
    Conflict,
    ConnectionFailed,
    NotFound,
    OrchestratorError,
    PermissionDenied,
    RateLimited,
    ServerError,
    Unauthenticated,
    ValidationFailed,
    WaitTimeout,
)
from tests.unit.cli_support import orch


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (Unauthenticated("no key", status_code=401), 2),
        (PermissionDenied("viewer", status_code=403), 2),
        (NotFound("no job", status_code=404), 2),
        (Conflict("ended", status_code=409), 2),
        (Conflict("ambiguous prefix"), 2),  # the SDK's own, no status
        (ValidationFailed("bad", status_code=422), 2),
        (OrchestratorError("too big", status_code=413), 2),
        (RateLimited("cap", status_code=429, retry_after=5), 1),
        (ServerError("boom", status_code=500), 1),
        (ServerError("bad gateway", status_code=502), 1),
        (ConnectionFailed("refused"), 1),
        (WaitTimeout("late"), 1),
    ],
)
def test_exit_code_of_each_error_class(error, code):
    assert exits.for_error(error) == code


def test_terminal_states_exit_codes():
    assert [exits.for_state(s) for s in ("SUCCEEDED", "FAILED", "CANCELLED", "RUNNING")] == [0, 1, 3, 1]


def test_a_server_error_is_one_line_with_its_request_id_and_exit_1(live, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))

    def broken(fresh=False):
        raise RuntimeError("the fake cluster broke")

    live.backend.capacity = broken  # submit asks Ray for its capacity: an unexpected error, a 500
    spec = tmp_path / "job.yaml"
    spec.write_text("workload: digits\n")
    result = orch(live, "jobs", "submit", "-f", str(spec))
    assert result.exit_code == 1, result.output
    line = result.stderr.strip()
    assert "\n" not in line and line.startswith("error: 500 POST /v1/jobs") and "request id" in line
