"""A run reads as gone only when Ray says so (docs/security.md, "Reliability").

The Ray backend read any error whose text held "404" as "Ray has no such job". Job ids
are random hex, and 0.7 % of them hold "404"; Ray's client puts the job id (the URL) in every error's text, so
a dashboard that answered 500 or refused the connection while asked about such a job made the reconciler see
the run MISSING (and fail or resubmit it), a stop that failed read as done, and the logs as gone. On the old
code ``test_a_transient_error_naming_a_job_with_404_in_its_id_is_unavailable_not_missing`` failed with
``RunInfo(status=<RunStatus.MISSING>, message='Ray has no record of this submission')`` for the 500, and
``test_only_rays_own_404_means_missing`` with MISSING for a proxy's bare 404.

Now the job routes are asked over plain HTTP (``orchestrator.backend.dashboard``) and classified by the HTTP
status: only a 404 carrying Ray's "does not exist" answer is MISSING; anything else is BackendUnavailable,
which every caller retries on its next tick. The dashboard here is a stub answering as Ray 2.60's
``job_head.py`` does (its routes, bodies and statuses), over real HTTP."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from orchestrator.backend import BackendUnavailable, RunInfo, RunStatus, SubmissionTaken
from orchestrator.backend.ray_backend import RayBackend

JOB = "5e404a1c9b2d4f6e8a7b3c1d0e9f8a7b"  # a job id with "404" in it: 0.7 % of them
SUBMISSION = f"{JOB}-1"


class StubDashboard:
    """Answers ``/api/version`` like Ray 2.60 and each job route with what ``answers`` says for its path:
    ``(status, body)``; a path not in ``answers`` is Ray's own 404 for an unknown job."""

    def __init__(self):
        self.answers: dict[str, tuple[int, str]] = {}
        self.seen: list[tuple[str, str]] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                stub.seen.append((self.command, self.path))
                if self.path == "/api/version":
                    status, body = 200, json.dumps({"version": "4", "ray_version": "2.60.0", "ray_commit": "x"})
                else:
                    job = self.path.removeprefix("/api/jobs/").split("/")[0]
                    status, body = stub.answers.get(self.path, (404, f"Job {job} does not exist"))
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_DELETE = _answer

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextmanager
def dashboard() -> Iterator[StubDashboard]:
    stub = StubDashboard()
    try:
        yield stub
    finally:
        stub.close()


def details(status: str, message: str = "", exit_code: int | None = None, error_type: str | None = None) -> str:
    """A JobDetails body as Ray's ``GET /api/jobs/{id}`` answers it (the fields the backend reads, and more)."""
    return json.dumps(
        {
            "type": "SUBMISSION",
            "job_id": "02000000",
            "submission_id": SUBMISSION,
            "driver_info": None,
            "status": status,
            "entrypoint": "python -m workers.train.driver",
            "message": message,
            "error_type": error_type,
            "start_time": 1,
            "end_time": None,
            "metadata": {},
            "runtime_env": {},
            "driver_agent_http_address": None,
            "driver_node_id": None,
            "driver_exit_code": exit_code,
        }
    )


def test_a_transient_error_naming_a_job_with_404_in_its_id_is_unavailable_not_missing():
    with dashboard() as ray:
        backend = RayBackend(ray.url)
        # The dashboard fails while asked about the job (its GCS is busy, a proxy times out, ...): 500 and 502
        # answers naming the job, as Ray's handlers do with a traceback.
        for status in (500, 502, 503):
            failure = (status, f"Traceback (most recent call last): reading job {SUBMISSION} ... TimeoutError")
            ray.answers = {
                f"/api/jobs/{SUBMISSION}": failure,
                f"/api/jobs/{SUBMISSION}/logs": failure,
                f"/api/jobs/{SUBMISSION}/stop": failure,
            }
            with pytest.raises(BackendUnavailable):
                backend.info(SUBMISSION)
            with pytest.raises(BackendUnavailable):
                backend.logs(SUBMISSION)
            with pytest.raises(BackendUnavailable):  # a stop that did not happen is not reported done
                backend.stop(SUBMISSION)
        ray.answers = {f"/api/jobs/{SUBMISSION}": (200, details("RUNNING", "Job is currently running."))}
        assert backend.info(SUBMISSION) == RunInfo(RunStatus.RUNNING, "Job is currently running.", None)
    # The dashboard is gone (restarting): the refused connection is no news about the job.
    with pytest.raises(BackendUnavailable):
        backend.info(SUBMISSION)
    with pytest.raises(BackendUnavailable):
        backend.logs(SUBMISSION)
    with pytest.raises(BackendUnavailable):
        backend.stop(SUBMISSION)


def test_only_rays_own_404_means_missing():
    with dashboard() as ray:
        backend = RayBackend(ray.url)
        # Ray's own answer for a job it has no record of (job_head.py: 404, "Job <id> does not exist").
        assert backend.info(SUBMISSION).status is RunStatus.MISSING
        assert backend.logs(SUBMISSION) is None
        backend.stop(SUBMISSION)  # a run that is gone is fine to stop
        assert ("POST", f"/api/jobs/{SUBMISSION}/stop") in ray.seen
        # A 404 that is not Ray's answer about the job (a proxy or an ingress in front of a dashboard that is
        # not there yet) says nothing about the job.
        ray.answers = {f"/api/jobs/{SUBMISSION}": (404, "404: Not Found")}
        with pytest.raises(BackendUnavailable):
            backend.info(SUBMISSION)


def test_rays_answers_are_read_as_they_are():
    with dashboard() as ray:
        backend = RayBackend(ray.url, token="t0k")
        ray.answers = {
            f"/api/jobs/{SUBMISSION}": (200, details("FAILED", "Job entrypoint command failed with exit code 3", 3)),
            f"/api/jobs/{SUBMISSION}/logs": (200, json.dumps({"logs": "line 1\nline 404\n"})),
            f"/api/jobs/{SUBMISSION}/stop": (200, json.dumps({"stopped": False})),
        }
        assert backend.info(SUBMISSION) == RunInfo(
            RunStatus.FAILED, "Job entrypoint command failed with exit code 3", 3
        )
        assert backend.logs(SUBMISSION) == "line 1\nline 404\n"
        backend.stop(SUBMISSION)
        # A body that is not Ray's JobDetails is no answer either.
        ray.answers = {f"/api/jobs/{SUBMISSION}": (200, "<html>sign in</html>")}
        with pytest.raises(BackendUnavailable):
            backend.info(SUBMISSION)


def test_the_installed_rays_dashboard_answers_an_unknown_job_as_the_backend_reads_it():
    """The stub's 404 is Ray's: every job route of the installed dashboard answers an unknown id so (this fails
    by name when a Ray upgrade changes it, rather than every lost run reading as "Ray unreachable")."""
    import importlib.util
    from pathlib import Path

    source = Path(importlib.util.find_spec("ray.dashboard.modules.job.job_head").origin).read_text()
    answer = 'text=f"Job {job_or_submission_id} does not exist",\n                status=aiohttp.web.HTTPNotFound.status_code,'
    for decorator in (
        '@routes.get("/api/jobs/{job_or_submission_id}")',
        '@routes.post("/api/jobs/{job_or_submission_id}/stop")',
        '@routes.get("/api/jobs/{job_or_submission_id}/logs")',
        '@routes.delete("/api/jobs/{job_or_submission_id}")',
    ):
        handler = source[source.index(decorator) :]
        handler = handler[: handler.index("@routes.", 1)]
        assert answer in handler, decorator


def test_a_driver_ray_could_not_place_reads_unschedulable_and_its_record_is_deleted():
    """Ray's error_type when the supervisor could not be placed (``job_manager.py``) marks the RunInfo, and
    ``forget`` deletes the ended job's record (``DELETE /api/jobs/{id}``); a job Ray has no record of is fine, an
    error is BackendUnavailable."""
    unplaced = "Job supervisor actor could not be scheduled: The actor is not schedulable: The node specified ..."
    with dashboard() as ray:
        backend = RayBackend(ray.url)
        ray.answers = {
            f"/api/jobs/{SUBMISSION}": (200, details("FAILED", unplaced, None, "JOB_SUPERVISOR_ACTOR_UNSCHEDULABLE"))
        }
        assert backend.info(SUBMISSION) == RunInfo(RunStatus.FAILED, unplaced, None, unschedulable=True)
        backend.forget(SUBMISSION)
        assert ("DELETE", f"/api/jobs/{SUBMISSION}") in ray.seen
        ray.answers = {f"/api/jobs/{SUBMISSION}": (200, details("FAILED", "runtime_env setup failed", None, "X"))}
        assert backend.info(SUBMISSION).unschedulable is False
        ray.answers = {}
        backend.forget(SUBMISSION)  # Ray's own 404: nothing to delete
        ray.answers = {f"/api/jobs/{SUBMISSION}": (500, "Traceback ... the job agent is gone")}
        with pytest.raises(BackendUnavailable):
            backend.forget(SUBMISSION)
    from ray.dashboard.modules.job.common import JobErrorType  # the value the backend reads is Ray's

    assert JobErrorType.JOB_SUPERVISOR_ACTOR_UNSCHEDULABLE.value == "JOB_SUPERVISOR_ACTOR_UNSCHEDULABLE"


def test_an_id_ray_already_has_is_ours_only_with_the_same_environment():
    """A submit Ray refuses as a duplicate is an earlier send of the same submission (its answer lost) only when
    Ray's job has the environment variables sent now, the driver's claim code among them; else SubmissionTaken."""
    ours = {"env_vars": {"ORCHESTRATOR_CLAIM_CODE": "c0de", "ORCHESTRATOR_URL": "http://cp:8000"}}
    with dashboard() as ray:
        backend = RayBackend(ray.url)
        duplicate = (400, f"Job with submission_id {SUBMISSION} already exists. Please use a different submission_id.")
        job = json.loads(details("RUNNING", "Job is currently running."))
        ray.answers = {
            "/api/jobs/": duplicate,
            f"/api/jobs/{SUBMISSION}": (200, json.dumps({**job, "runtime_env": ours})),
        }
        backend.submit(SUBMISSION, "python -m workers.train.driver", ours, {})  # ours: nothing more to do
        someone = {**job, "runtime_env": {"env_vars": {"X": "1"}}, "entrypoint": "python steal.py"}
        ray.answers[f"/api/jobs/{SUBMISSION}"] = (200, json.dumps(someone))
        with pytest.raises(SubmissionTaken, match="did not submit .*steal.py"):
            backend.submit(SUBMISSION, "python -m workers.train.driver", ours, {})
        ray.answers[f"/api/jobs/{SUBMISSION}"] = (502, "bad gateway")
        with pytest.raises(BackendUnavailable):  # can't tell: retried, never adopted
            backend.submit(SUBMISSION, "python -m workers.train.driver", ours, {})
