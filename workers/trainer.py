"""How one attempt of a JobSpec becomes a Ray Train ``TorchTrainer`` (shared by the driver and scripts)."""

from __future__ import annotations

from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

from workers.callbacks import RunEventForwarder
from workers.ray_context import train_loop_per_worker
from workers.spec import JobSpec, TrainingPlan


def build_trainer(
    *,
    job_id: str,
    attempt: int,
    spec: JobSpec,
    plan: TrainingPlan,
    storage_path: str,
    control_plane_url: str | None,
    token: str,
) -> TorchTrainer:
    """``control_plane_url=None`` makes every reporter only log (scripts, tests)."""
    scaling = spec.scaling
    resources = {"CPU": scaling.cpus_per_worker}
    if scaling.gpus_per_worker:
        resources["GPU"] = scaling.gpus_per_worker
    return TorchTrainer(
        train_loop_per_worker,
        train_loop_config={
            "job_id": job_id,
            "attempt": attempt,
            "control_plane_url": control_plane_url,
            "token": token,
            "spec": spec.model_dump(mode="json"),
            "plan": plan.model_dump(mode="json"),
        },
        scaling_config=ScalingConfig(
            num_workers=scaling.num_workers, use_gpu=scaling.use_gpu, resources_per_worker=resources
        ),
        # Same name and storage path on every attempt: a new attempt resumes the run's latest checkpoint.
        run_config=RunConfig(
            name=job_id,
            storage_path=storage_path,
            checkpoint_config=CheckpointConfig(num_to_keep=spec.checkpoint.keep),
            failure_config=FailureConfig(max_failures=spec.retries.max_worker_restarts),
            callbacks=[RunEventForwarder(control_plane_url, job_id, attempt, token)],
        ),
    )
