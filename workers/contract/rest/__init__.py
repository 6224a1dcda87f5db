"""The REST API's request and response models (besides the specs, which are ``workers.contract.jobs``,
``workers.contract.sweeps`` and ``workers.contract.deployments``), and its error shapes. The API answers
with these, and clients (SDK, CLI, dashboard) parse answers with them: nobody keeps a second copy.

Plain pydantic: no SQLAlchemy, Ray, PyTorch or FastAPI. Response models read database rows by attribute
name (``Model.model_validate(row)``), without importing the ORM.
"""

from workers.contract.rest.cluster import ClusterStatus, QueuedJobOut, WhoAmI
from workers.contract.rest.code import CodeFileOut, CodePackageOut, CodeUploaded
from workers.contract.rest.deployments import DeploymentEventOut, DeploymentOut, DeploymentVersionOut, ReplicaOut
from workers.contract.rest.errors import ErrorMessage, FieldError, FieldErrors
from workers.contract.rest.jobs import CheckpointOut, JobEventOut, JobOut, JobPage, MetricOut, RunOut
from workers.contract.rest.plan import BytesPerParam, PlanRequest, PlanResponse, StrategyFit
from workers.contract.rest.projects import (
    KeyCreate,
    KeyCreated,
    KeyOut,
    ProjectCreate,
    ProjectOut,
    ProjectPatch,
    Quota,
)
from workers.contract.rest.sweeps import BestTrialOut, SweepOut, TrialEventOut, TrialMetricOut, TrialOut
from workers.contract.rest.usage import UsageAmounts, UsageAttempt, UsageReport, UsageRow, UsageTrial

__all__ = [
    "BestTrialOut",
    "BytesPerParam",
    "CheckpointOut",
    "ClusterStatus",
    "CodeFileOut",
    "CodePackageOut",
    "CodeUploaded",
    "DeploymentEventOut",
    "DeploymentOut",
    "DeploymentVersionOut",
    "ErrorMessage",
    "FieldError",
    "FieldErrors",
    "JobEventOut",
    "JobOut",
    "JobPage",
    "KeyCreate",
    "KeyCreated",
    "KeyOut",
    "MetricOut",
    "PlanRequest",
    "PlanResponse",
    "ProjectCreate",
    "ProjectOut",
    "ProjectPatch",
    "QueuedJobOut",
    "Quota",
    "ReplicaOut",
    "RunOut",
    "StrategyFit",
    "SweepOut",
    "TrialEventOut",
    "TrialMetricOut",
    "TrialOut",
    "UsageAmounts",
    "UsageAttempt",
    "UsageReport",
    "UsageRow",
    "UsageTrial",
    "WhoAmI",
]
