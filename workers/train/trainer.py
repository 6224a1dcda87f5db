"""How one attempt of a JobSpec becomes a Ray Train ``TorchTrainer`` (shared by the driver and scripts)."""

from __future__ import annotations

from collections.abc import Sequence

from ray.train import CheckpointConfig, FailureConfig, Result, RunConfig, ScalingConfig, UserCallback
from ray.train.torch import TorchTrainer
from ray.util.placement_group import NODE_ID_LABEL_KEY

from orchestrator_contract.jobs import JobSpec, TrainingPlan
from workers.runtime.train_loop import EPOCH_RANK_TIMES
from workers.train.callbacks import RunEventForwarder
from workers.train.code_errors import blame_user_code
from workers.train.failures import CauseAwareFailurePolicy, failure_policy
from workers.train.group_start import WaitForFreedResources, WorkersUp, without_unused_datasets_callback
from workers.train.ray_context import train_loop_per_worker
from workers.train.run_snapshot import forget_deleted_checkpoints


def build_trainer(
    *,
    job_id: str,
    attempt: int,
    spec: JobSpec,
    plan: TrainingPlan,
    storage_path: str,
    control_plane_url: str | None,
    token: str,
    extra_callbacks: Sequence[UserCallback] = (),
    start_from: str | None = None,
    sweep_control: dict | None = None,
    avoid_nodes: Sequence[str] = (),
    background_checkpoints: bool = True,
    epoch_rank_times: bool = False,
) -> JobTrainer:
    """``control_plane_url=None`` makes every reporter only log (scripts, tests, sweep trials).
    ``start_from``: a checkpoint the run starts from while it has none of its own (``RayContext``).
    ``sweep_control``: a sweep trial's way to hear of its sweep's preemption (``workers.runtime.control``).
    ``avoid_nodes``: Ray node ids no worker may be placed on (bad nodes: ``DriverAssignment.avoid_nodes``).
    ``background_checkpoints``: whether ``checkpoint.async`` writes and reports on the loop's writer thread
    (``workers.runtime.checkpoint_writer``); False: the loop writes, only the upload is in the background.
    ``epoch_rank_times``: a sweep trial's epoch results carry each rank's own seconds per step over the epoch, for the
    control plane's straggler detection (``workers.runtime.train_loop.EPOCH_RANK_TIMES``)."""
    # Ray Train would refuse to start on a run snapshot that names checkpoints retention deleted.
    forget_deleted_checkpoints(storage_path, job_id)
    scaling = spec.scaling
    resources = {"CPU": scaling.cpus_per_worker}
    if scaling.gpus_per_worker:
        resources["GPU"] = scaling.gpus_per_worker
    trainer = JobTrainer(
        blame_user_code(train_loop_per_worker),  # an error of the job's own code fails it as code_error
        train_loop_config={
            "job_id": job_id,
            "attempt": attempt,
            "control_plane_url": control_plane_url,
            "token": token,
            "spec": spec.model_dump(mode="json"),
            "plan": plan.model_dump(mode="json"),
            "start_from": start_from,
            "sweep_control": sweep_control,
            "background_checkpoints": background_checkpoints,
            EPOCH_RANK_TIMES: epoch_rank_times,
        },
        scaling_config=ScalingConfig(
            num_workers=scaling.num_workers,
            use_gpu=scaling.use_gpu,
            resources_per_worker=resources,
            label_selector=avoiding(avoid_nodes),
        ),
        # Same name and storage path on every attempt: a new attempt resumes the run's latest checkpoint.
        run_config=RunConfig(
            name=job_id,
            storage_path=storage_path,
            # Ray Train keeps every checkpoint, a job's and a sweep trial's; the control plane's retention
            # deletes them, storage first, then its database (orchestrator/checkpoint_policy.py).
            checkpoint_config=CheckpointConfig(num_to_keep=None),
            failure_config=FailureConfig(max_failures=spec.retries.max_worker_restarts),
            callbacks=[
                RunEventForwarder(control_plane_url, job_id, attempt, token),
                WaitForFreedResources(),
                WorkersUp((control_plane_url, job_id, attempt, token)),
                *extra_callbacks,
            ],
        ),
    )
    trainer.retry_app_errors = spec.retries.retry_app_errors
    trainer.reporter_args = (control_plane_url, job_id, attempt, token)
    return trainer


def avoiding(nodes: Sequence[str]) -> dict[str, str] | None:
    """A Ray label selector that keeps every worker off ``nodes`` (by their ``ray.io/node-id`` label)."""
    return {NODE_ID_LABEL_KEY: f"!in({','.join(nodes)})"} if nodes else None


class JobTrainer(TorchTrainer):
    """A ``TorchTrainer`` whose worker failures are retried by cause (``workers.train.failures``) and whose
    worker groups start without an idle Ray Data actor (``workers.train.group_start``)."""

    retry_app_errors: bool = False
    reporter_args: tuple = (None, "", 0, "")  # EventReporter(url, job_id, attempt, token)

    def fit(self) -> Result:
        def make_policy(config: FailureConfig) -> CauseAwareFailurePolicy:
            return CauseAwareFailurePolicy(config, self.retry_app_errors, self.reporter_args)

        with failure_policy(make_policy):
            return super().fit()

    def _create_default_callbacks(self) -> list:
        return without_unused_datasets_callback(super()._create_default_callbacks(), self.datasets)
