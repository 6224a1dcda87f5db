"""How ``orch`` turns each SDK error class into a line and an exit code: 2 for what the caller can fix (401,
403, 404, 409, 422, an ambiguous name), 1 for the rest (429 after the retries, 5xx, no answer)."""

from __future__ import annotations

import pytest

from orchestrator_client import errors
from orchestrator_client.cli import exits
from tests.unit.cli_support import orch

EXIT_CODES = [
    (errors.Unauthenticated("no key", status_code=401), 2),
    (errors.PermissionDenied("viewer", status_code=403), 2),
    (errors.NotFound("no job", status_code=404), 2),
    (errors.Conflict("ended", status_code=409), 2),
    (errors.Conflict("ambiguous prefix"), 2),  # the SDK's own, no status
    (errors.ValidationFailed("bad", status_code=422), 2),
    (errors.OrchestratorError("too big", status_code=413), 2),
    (errors.RateLimited("cap", status_code=429, retry_after=5), 1),
    (errors.ServerError("boom", status_code=500), 1),
    (errors.ServerError("bad gateway", status_code=502), 1),
    (errors.ConnectionFailed("refused"), 1),
    (errors.WaitTimeout("late"), 1),
]


@pytest.mark.parametrize(("error", "code"), EXIT_CODES)
def test_exit_code_of_each_error_class(error, code):
    assert exits.for_error(error) == code


def test_the_table_has_every_error_class():
    """A class added to the SDK without a row here would get an exit code no test checks."""
    classes = {c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.OrchestratorError)}
    assert classes - {errors.AuthError} == {type(error) for error, _ in EXIT_CODES}  # AuthError: a base only


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
