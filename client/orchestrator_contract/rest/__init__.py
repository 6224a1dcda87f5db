"""The REST API's request and response models (besides the specs, which are ``orchestrator_contract.jobs``,
``orchestrator_contract.sweeps`` and ``orchestrator_contract.deployments``), and its error shapes. The API answers
with these, and clients (SDK, CLI, dashboard) parse answers with them: nobody keeps a second copy.

Plain pydantic: no SQLAlchemy, Ray, PyTorch or FastAPI. Response models read database rows by attribute
name (``Model.model_validate(row)``), without importing the ORM.
"""

from orchestrator_contract.rest.cluster import (
    BadNodeOut,
    ClusterHealthOut,
    ClusterStatus,
    ForeignJobOut,
    NodeFaultOut,
    QueuedJobOut,
    WhoAmI,
)
from orchestrator_contract.rest.clusters import (
    ClusterCreate,
    ClusterOut,
    ClusterPatch,
    ProjectClusterOut,
    ProjectClusters,
    ProjectClustersOut,
)
from orchestrator_contract.rest.code import CodeFileOut, CodePackageOut, CodeUploaded
from orchestrator_contract.rest.deployments import DeploymentEventOut, DeploymentOut, DeploymentVersionOut, ReplicaOut
from orchestrator_contract.rest.errors import ErrorMessage, FieldError, FieldErrors
from orchestrator_contract.rest.jobs import (
    CheckpointOut,
    GoodputOut,
    JobEventOut,
    JobOut,
    JobPage,
    LostTime,
    MetricOut,
    RunOut,
)
from orchestrator_contract.rest.paging import Paged
from orchestrator_contract.rest.plan import BytesPerParam, PlanRequest, PlanResponse, StrategyFit
from orchestrator_contract.rest.projects import (
    ClusterQuota,
    KeyCreate,
    KeyCreated,
    KeyOut,
    ProjectCreate,
    ProjectOut,
    ProjectPatch,
    Quota,
)
from orchestrator_contract.rest.sweeps import BestTrialOut, SweepOut, TrialEventOut, TrialMetricOut, TrialOut
from orchestrator_contract.rest.usage import UsageAmounts, UsageAttempt, UsageReport, UsageRow, UsageTrial

__all__ = [
    "BadNodeOut",
    "BestTrialOut",
    "BytesPerParam",
    "CheckpointOut",
    "ClusterCreate",
    "ClusterHealthOut",
    "ClusterOut",
    "ClusterPatch",
    "ClusterQuota",
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
    "ForeignJobOut",
    "GoodputOut",
    "JobEventOut",
    "JobOut",
    "JobPage",
    "KeyCreate",
    "KeyCreated",
    "KeyOut",
    "LostTime",
    "MetricOut",
    "NodeFaultOut",
    "Paged",
    "PlanRequest",
    "PlanResponse",
    "ProjectClusterOut",
    "ProjectClusters",
    "ProjectClustersOut",
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
