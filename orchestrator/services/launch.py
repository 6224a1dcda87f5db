"""What the control plane hands Ray to start one attempt of a job: a fixed command, our own env."""

from __future__ import annotations

from orchestrator.db.models import Job
from orchestrator.settings import Settings

DRIVER_MODULE = "workers.driver"


def driver_entrypoint(job: Job) -> str:
    # Ray Jobs runs this through a shell, so it is built from server-made values only: the job id
    # (uuid hex) and the attempt number. The driver fetches its spec from the control plane.
    assert job.id.isalnum(), job.id
    return f"python -m {DRIVER_MODULE} --job-id {job.id} --attempt {int(job.attempt)}"


def driver_env(job_token: str, settings: Settings) -> dict[str, str]:
    return {
        "ORCHESTRATOR_URL": settings.control_plane_url,
        "ORCHESTRATOR_JOB_TOKEN": job_token,
        # Two CPU workers on two cores oversubscribe fast with torch's default thread pool.
        "OMP_NUM_THREADS": "1",
        # ray.train.report blocks until the controller polls (RAY-NOTES.md); poll faster than 2 s.
        "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": str(settings.train_poll_interval_s),
    }
