"""The Python SDK of the training orchestrator: everything the REST API does, from a script or a notebook.

It speaks the public REST API only and parses answers with the public contract's models
(``orchestrator_contract``): installing it pulls in neither Ray, PyTorch nor SQLAlchemy. docs/sdk.md shows it all::

    from orchestrator_client import Client

    with Client() as client:  # url and key: arguments, ORCHESTRATOR_URL/_TOKEN, or `orch login`'s profile
        job = client.jobs.submit("spec.yaml", overrides=["epochs=3"])
        for line in job.logs(follow=True):
            print(line)
        print(job.wait().state, job.best_checkpoint())
"""

from orchestrator_client.client import Client
from orchestrator_client.config import ConfigError
from orchestrator_client.errors import (
    AuthError,
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
from orchestrator_client.paging import Pager
from orchestrator_client.resources.deployments import Deployment
from orchestrator_client.resources.jobs import Job
from orchestrator_client.resources.sweeps import Sweep, Trial
from orchestrator_client.specs import SpecError, load_spec

__all__ = [
    "AuthError",
    "Client",
    "ConfigError",
    "Conflict",
    "ConnectionFailed",
    "Deployment",
    "Job",
    "NotFound",
    "OrchestratorError",
    "Pager",
    "PermissionDenied",
    "RateLimited",
    "ServerError",
    "SpecError",
    "Sweep",
    "Trial",
    "Unauthenticated",
    "ValidationFailed",
    "WaitTimeout",
    "load_spec",
]
