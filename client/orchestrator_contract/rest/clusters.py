"""The Ray clusters behind the control plane and the projects bound to them: ``/v1/clusters`` and
``/v1/projects/{id}/clusters`` (docs/clusters.md).

A cluster's token is never sent to the API nor stored: ``token_ref`` says where the control plane reads it. A Ray
cluster is one trust domain (whatever runs on it can reach everything else on it), so a cluster's ``tenancy``
says whose code may share it, and every answer spells that out in ``trust``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, Field, StringConstraints, field_validator, model_validator

from orchestrator_contract.base import Strict
from orchestrator_contract.placement import ClusterLabels, ClusterName

Tenancy = Literal["dedicated", "shared"]
TOKEN_REF_PATTERN = r"^(env:[A-Za-z_][A-Za-z0-9_]*|file:/.+)$"
MAX_LABELS = 16
MAX_BINDINGS = 32


def _http_url(address: str) -> str:
    parts = urlsplit(address)
    if parts.scheme not in ("http", "https") or not parts.hostname or any(c.isspace() for c in address):
        raise ValueError("the address is the cluster's Ray dashboard URL: http(s)://host:port (e.g. http://head:8265)")
    return address.rstrip("/")


Address = Annotated[str, StringConstraints(min_length=1, max_length=512), AfterValidator(_http_url)]
TokenRef = Annotated[str, StringConstraints(max_length=512, pattern=TOKEN_REF_PATTERN)]
StorageRoot = Annotated[str, StringConstraints(min_length=1, max_length=1024)]

_NAME = Field(
    description="The cluster's name, unique among clusters: a DNS label (lower-case letters, digits and '-', "
    "at most 63 characters), also a KubeRay RayCluster's name. It never changes: runs placed on the cluster keep "
    "it, and job specs name it in `placement.cluster`."
)
_ADDRESS_DESCRIPTION = (
    "The URL of the cluster's Ray dashboard (http or https, e.g. http://ray-head.gpu-team:8265), where the control "
    "plane reaches Ray's Jobs and State APIs. It must be reachable from the control plane."
)
_TOKEN_REF_DESCRIPTION = (
    "Where the control plane reads the cluster's authentication token (the one its Ray dashboard asks for), if it "
    "asks for one: `env:NAME` (an environment variable of the control plane's processes) or `file:/path` (a file "
    "on the control plane's machines, e.g. a mounted Kubernetes secret). The token itself is never sent to this "
    "API, stored in the database or shown in an answer: only where it is read. Null: the cluster takes no token."
)
_LABELS_DESCRIPTION = (
    f'Labels runs can be placed by (at most {MAX_LABELS}, e.g. {{"gpu": "h100", "region": "eu"}}): a job, '
    "sweep or deployment whose `placement.labels` are all among them may run here, if its project may use the "
    "cluster."
)
_STORAGE_ROOT_DESCRIPTION = (
    "Where runs on this cluster write checkpoints and output: a path all of its nodes share, or an fsspec/pyarrow "
    "URI (e.g. s3://bucket/prefix). Null: the service's own storage (ORCHESTRATOR_STORAGE)."
)
_SERVE_URL_DESCRIPTION = (
    "The base URL of the cluster's Ray Serve HTTP proxy, as callers reach it: the start of its deployments' `url`. "
    "Null: the address's host on its `serve_port`."
)
_SERVE_PORT_DESCRIPTION = (
    "The port its Ray Serve HTTP proxy listens on, on each of its nodes (Serve's `http_options.port`). Null: "
    "ORCHESTRATOR_SERVE_PORT. Give another one where two clusters share hosts (e.g. two local clusters); Serve keeps "
    "the port it started with until its applications are all removed."
)
ServePort = Annotated[int, Field(ge=1, le=65535)]
_TENANCY_DESCRIPTION = (
    "Who may run here. `dedicated`: one project only (binding a second project to it is a 409). `shared`: every "
    "project bound to it, and those projects then trust each other: a Ray cluster is one trust domain, whatever "
    "runs on it can reach everything else on it. Give a team that must not share a dedicated cluster."
)


class ClusterCreate(Strict):
    """``POST /v1/clusters`` (cluster-wide admins): register a Ray cluster the control plane then drives. No project
    may use it until it is bound to the cluster (``PUT /v1/projects/{id}/clusters``)."""

    name: ClusterName = _NAME
    address: Address = Field(description=_ADDRESS_DESCRIPTION)
    token_ref: TokenRef | None = Field(None, description=_TOKEN_REF_DESCRIPTION)
    labels: ClusterLabels = Field(default_factory=dict, max_length=MAX_LABELS, description=_LABELS_DESCRIPTION)
    storage_root: StorageRoot | None = Field(None, description=_STORAGE_ROOT_DESCRIPTION)
    serve_url: Address | None = Field(None, description=_SERVE_URL_DESCRIPTION)
    serve_port: ServePort | None = Field(None, description=_SERVE_PORT_DESCRIPTION)
    tenancy: Tenancy = Field("shared", description=_TENANCY_DESCRIPTION)


class ClusterPatch(Strict):
    """``PATCH /v1/clusters/{name}`` (cluster-wide admins): the fields given change, those left out stay as they
    are. The name cannot change (runs keep it). ``token_ref``, ``storage_root``, ``serve_url`` and ``serve_port`` may
    be set to null (no token; the service's storage; their defaults); the other fields may not."""

    address: Address | None = Field(
        None,
        description=_ADDRESS_DESCRIPTION + " Runs already on the cluster keep running; the control plane reaches it "
        "at the new address from its next call.",
    )
    token_ref: TokenRef | None = Field(None, description=_TOKEN_REF_DESCRIPTION)
    labels: ClusterLabels | None = Field(
        None, max_length=MAX_LABELS, description=_LABELS_DESCRIPTION + " Replaced whole: give every label to keep."
    )
    storage_root: StorageRoot | None = Field(
        None, description=_STORAGE_ROOT_DESCRIPTION + " Runs already placed keep the storage they started with."
    )
    serve_url: Address | None = Field(None, description=_SERVE_URL_DESCRIPTION)
    serve_port: ServePort | None = Field(None, description=_SERVE_PORT_DESCRIPTION)
    tenancy: Tenancy | None = Field(
        None,
        description=_TENANCY_DESCRIPTION + " Making a cluster dedicated while two or more projects are bound to it "
        "is a 409.",
    )

    @model_validator(mode="after")
    def _no_null_where_null_means_nothing(self) -> ClusterPatch:
        nulled = [
            f for f in ("address", "labels", "tenancy") if f in self.model_fields_set and getattr(self, f) is None
        ]
        if nulled:
            raise ValueError(f"{', '.join(nulled)} may not be null: leave a field out to keep it as it is")
        return self


def _and(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def trust_of(tenancy: str, is_default: bool, projects: Sequence[str], others: int = 0) -> str:
    """What a cluster's tenancy means for the projects on it, in a sentence (``ClusterOut.trust``). ``projects``:
    the names of the bound projects shown; ``others``: how many more are bound but not named (a project's own view
    names no other project)."""
    named = [f"project {name}" for name in projects]
    if others:
        named.append(f"{others} other project{'s' if others > 1 else ''}")
    if tenancy == "dedicated":
        if len(projects) == 1 and not others:
            return f"dedicated: only project {projects[0]}'s code runs here; no other project's run is placed on it."
        if not named:
            return "dedicated: only the one project bound to it may run here; none is bound yet, so nothing runs here."
        return (
            f"dedicated, yet {_and(named)} are bound to it: they share it and so trust each other (a Ray cluster is "
            "one trust domain). Bind all but one elsewhere."
        )
    if is_default:
        named.append("every project with no cluster binding")
    if not named:
        return (
            "shared: no project is bound yet, so nothing runs here; the projects bound to it will trust each other: "
            "a Ray cluster is one trust domain."
        )
    who = _and(named)
    return (
        f"shared: {who} run here and so trust each other: a Ray cluster is one trust domain (code running on it can "
        "reach whatever else runs on it). A project that must not share needs a dedicated cluster."
    )


class ClusterOut(BaseModel):
    """A registered Ray cluster, as cluster-wide admins see it. Never its token: only where it is read."""

    name: str = Field(description="The cluster's name (fixed; runs and `placement.cluster` name it).")
    address: str = Field(description="The URL of its Ray dashboard, where the control plane reaches it.")
    token_ref: str | None = Field(
        description="Where the control plane reads its token (`env:NAME` or `file:/path`); the token itself is never "
        "shown. Null: it takes no token."
    )
    labels: dict[str, str] = Field(description="The labels runs can be placed by (`placement.labels`).")
    storage_root: str | None = Field(
        description="Where runs on it write checkpoints and output; null: the service's own storage."
    )
    serve_url: str | None = Field(None, description="The base of its deployments' URLs; null: see ClusterCreate.")
    serve_port: int | None = Field(
        None, description="The port its Serve proxy listens on; null: ORCHESTRATOR_SERVE_PORT."
    )
    tenancy: Tenancy = Field(description="dedicated (one project only) or shared (the projects bound to it).")
    is_default: bool = Field(
        description="The service's own cluster (the local one or RAY_ADDRESS's): every project with no cluster "
        "binding runs here. It cannot be deleted, and its address and token come from the service's settings."
    )
    projects: list[str] = Field(description="The names of the projects bound to it, alphabetically.")
    trust: str = Field(
        description="Whose code shares this cluster, in a sentence: dedicated, only the one project's; shared, every "
        "project bound to it (and, for the default cluster, every project with no binding), which therefore trust "
        "each other (a Ray cluster is one trust domain)."
    )
    created_at: datetime = Field(description="When it was registered (UTC).")


class ProjectClusters(Strict):
    """``PUT /v1/projects/{id}/clusters`` (cluster-wide admins): the clusters the project may use, replacing those
    it had. Its runs are placed on one of them (by ``placement``, else by the scheduler); runs already placed stay
    where they are."""

    clusters: list[ClusterName] = Field(
        min_length=1,
        max_length=MAX_BINDINGS,
        description=f"Names of registered clusters (1 to {MAX_BINDINGS}, each once). An unknown name is a 422; a "
        "dedicated cluster another project is bound to is a 409. Name the default cluster to keep it among them.",
    )

    @field_validator("clusters")
    @classmethod
    def _each_once(cls, names: list[str]) -> list[str]:
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"each cluster once: {', '.join(repeated)} given more than once")
        return names


class ProjectClusterOut(BaseModel):
    """A cluster as a project's keys see it: what placement needs and whom it is shared with, not how the control
    plane reaches it (its address, token and storage are the cluster-wide admins')."""

    name: str = Field(description="The cluster's name (`placement.cluster`).")
    labels: dict[str, str] = Field(description="Its labels (`placement.labels`).")
    tenancy: Tenancy = Field(description="dedicated (this project only) or shared.")
    is_default: bool = Field(description="The service's own cluster, which every project with no binding uses.")
    trust: str = Field(
        description="Whose code shares the cluster with this project's, in a sentence (other projects are counted, "
        "not named)."
    )


class ProjectClustersOut(BaseModel):
    """``GET`` and ``PUT /v1/projects/{id}/clusters``: where the project's runs may be placed."""

    project_id: str = Field(description="The project.")
    clusters: list[ProjectClusterOut] = Field(
        description="The clusters its runs may be placed on, by name: those it is bound to, or else the default "
        "cluster."
    )
    default: bool = Field(
        description="True when the project has no binding and so uses the default cluster (shared with every other "
        "project that has none)."
    )
