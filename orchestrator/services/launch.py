"""What the control plane hands Ray to start one attempt of a job: a fixed command and a whole runtime_env.

The control plane builds the submission's ``runtime_env`` here, in ``runtime_env``, and the backend passes
it to Ray as it is. Today it holds ``env_vars``; a run's code (``working_dir``, ``py_modules``) and its
requirements (``pip``) go in here too. Only what a driver needs goes in, and never one of the control
plane's secrets (admin tokens, the database URL, other runs' tokens): the cluster is another trust domain
(docs/security.md). A run's own token is the one credential it carries.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orchestrator.auth import generate_secret, hash_secret
from orchestrator.backend import ClusterBackend
from orchestrator.db.models import Job, Sweep
from orchestrator.settings import Settings

DRIVER_MODULE = "workers.train.driver"


@dataclass(frozen=True)
class Launch:
    """One attempt's submission, read off the job row while it is locked and sent after the commit."""

    submission_id: str
    entrypoint: str
    metadata: dict[str, str]

    @classmethod
    def of(cls, run: Job | Sweep, kind: str = "job", module: str = DRIVER_MODULE) -> Launch:
        """``run``'s current attempt, started by ``python -m <module> --<kind>-id ID --attempt N``."""
        # Ray Jobs runs the entrypoint through a shell, so it is built from server-made values only: the
        # run's id (uuid hex) and the attempt number. The driver fetches its spec from the control plane.
        assert run.id.isalnum(), run.id
        return cls(
            submission_id=run.submission_id,
            entrypoint=f"python -m {module} --{kind}-id {run.id} --attempt {int(run.attempt)}",
            metadata={f"{kind}_id": run.id, "attempt": str(run.attempt), "project_id": run.project_id},
        )

    def submit(self, backend: ClusterBackend, job_token: str, settings: Settings) -> None:
        backend.submit(self.submission_id, self.entrypoint, runtime_env(job_token, settings), self.metadata)


def new_job_token(run: Job | Sweep) -> str:
    """A fresh credential for the run's next driver; only its hash is kept, so an old driver's stops working."""
    token = generate_secret("jtk_")
    run.token_hash = hash_secret(token)
    return token


def runtime_env(job_token: str, settings: Settings) -> dict[str, Any]:
    """Ray's ``runtime_env`` for one attempt's driver (its workers inherit it)."""
    return {"env_vars": driver_env(job_token, settings)}


def driver_env(job_token: str, settings: Settings) -> dict[str, str]:
    """The driver's environment variables: a fixed list, built from settings that are safe to send."""
    return {
        "ORCHESTRATOR_URL": settings.control_plane_url,
        "ORCHESTRATOR_JOB_TOKEN": job_token,
        # Two CPU workers on two cores oversubscribe fast with torch's default thread pool.
        "OMP_NUM_THREADS": "1",
        # How often the Train controller polls workers; ray.train.report blocks until it does.
        "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": str(settings.train_poll_interval_s),
        # Its actor starts with every worker group, i.e. it competes for the CPU when a group restarts.
        "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "1" if settings.watch_preemption else "0",
    }
