"""The cluster page (``/ui/cluster``) and its JSON (``/ui/api/cluster``): the Ray nodes and what each holds, the
CPUs and GPUs in use and free as the scheduler reckons them, and the queue with the reason each job waits.

Resources and nodes are the cluster's (shared by every project: another project's running work shows as
"used", never by name). The queue, the job counts and the queued sweeps are the user's scope's only: a
project's key sees its own project's waiting jobs; a cluster-wide admin sees every project's (or the chosen
project's). The numbers are ``GET /v1/cluster``'s (``orchestrator.services.cluster_status``)."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from sqlalchemy.orm import Session

from api.deps import ControlPlaneDep, SessionDep
from api.ui.auth import UiUser, UiUserDep
from api.ui.live import json_answer
from api.ui.templating import render
from orchestrator.backend import BackendUnavailable
from orchestrator.repositories import sweeps as sweeps_repo
from orchestrator.services.cluster_status import QUEUE_LIMIT, cluster_status

log = logging.getLogger(__name__)

router = APIRouter()
api_router = APIRouter(prefix="/api")

RESOURCES = ("CPU", "GPU")


def queued_sweeps(session: Session, scope: str | None) -> list[dict[str, Any]]:
    """The QUEUED sweeps of the scope, in admission order (priority, then age), why each waits."""
    return [
        {
            "id": s.id,
            "name": s.name,
            "project_id": s.project_id,
            "priority": s.priority,
            "reason": s.reason,
            "message": s.message,
            "created_at": s.created_at.isoformat(),
        }
        for s in sweeps_repo.queued_in_admission_order(session, scope, QUEUE_LIMIT)
    ]


def cluster_view(session: Session, service, user: UiUser) -> dict[str, Any]:
    status = cluster_status(session, service.backends, user.scope, service.settings).model_dump(mode="json")
    sweeps = queued_sweeps(session, user.scope)
    session.rollback()  # read only: Ray is asked for the nodes below with no transaction (SQLite's write lock) held
    resources = []
    for name in RESOURCES:
        total = float(status["total"].get(name, 0.0))
        free = float(status["available"].get(name, 0.0))
        resources.append({"name": name, "total": total, "free": free, "used": max(total - free, 0.0)})
    return {
        "ray": status["ray"],
        "resources": resources,
        "nodes": cluster_nodes(service, status),
        "jobs": status["jobs"],
        "queue": status["queue"],
        "queue_limit": status["queue_limit"],
        "queued_sweeps": sweeps,
        "all_projects": user.scope is None,
        "clusters": status["clusters"],  # every cluster the user's runs may use (docs/clusters.md)
    }


def cluster_nodes(service, status: dict[str, Any]) -> list[dict[str, Any]]:
    """The alive nodes of every cluster the user's runs may use that answered (``status["clusters"]``), each with
    its cluster's name, and whether the bad-node checks keep it out."""
    bad = {b["node_id"]: b for b in status["bad_nodes"]}
    clusters = [k["name"] for k in status["clusters"] if k["ray"] == "ok"] or (
        [service.backends.default_name] if status["ray"] == "ok" else []
    )
    nodes: list[dict[str, Any]] = []
    for name in clusters:
        try:
            found = service.backends.get(name).nodes()
        except BackendUnavailable as exc:
            log.warning("cluster page: listing the Ray nodes of cluster %s failed: %s", name, exc)
            continue
        nodes += [
            {
                "cluster": name,
                "node_id": n.node_id,
                "address": n.address,
                "is_head": n.is_head,
                "total": n.total,
                "kept_out": bad[n.node_id]["excluded_until"] if n.node_id in bad else None,
                "faults": bad[n.node_id]["fault_count"] if n.node_id in bad else 0,
            }
            for n in found
        ]
    return nodes


@router.get("/cluster")
def cluster_page(request: Request, session: SessionDep, service: ControlPlaneDep, user: UiUserDep) -> Response:
    return render(request, "cluster.html", user, session=session, c=cluster_view(session, service, user))


@api_router.get("/cluster")
def cluster_json(request: Request, session: SessionDep, service: ControlPlaneDep, user: UiUserDep) -> Response:
    return json_answer(request, cluster_view(session, service, user))
