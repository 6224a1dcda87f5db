"""What each live Ray job holds, from Ray's own lists: ``GET /api/jobs/`` and the State API's actors, placement
groups and tasks (no ray import; ``RayBackend.live_jobs`` fetches them, tests feed recorded ones).

Measured on Ray 2.60 (docs/clusters.md, "Ray jobs the control plane did not submit"):
- an actor's ``required_resources`` are what it holds while alive (``num_cpus=0.5``: 0.5 CPU; a plain actor: none);
- a submission's driver holds its entrypoint resources through its supervisor actor, which Ray names
  ``_ray_internal_job_actor_<submission id>`` and creates under the dashboard's own (unlisted) job;
- a placement group holds its bundles from CREATED on, whatever runs in it (counted once, not per actor or task);
- a running task outside a placement group holds its ``required_resources`` (the list gives them with ``detail``).
Anything under a job Ray does not list (the dashboard's, and Serve's controller and replicas it starts) is Ray's
own or the control plane's deployments, which the scheduler counts already: left out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from orchestrator.admission import RESOURCES
from orchestrator.backend import RayJob

LIVE_STATUSES = frozenset({"PENDING", "RUNNING"})
SUPERVISOR_PREFIX = "_ray_internal_job_actor_"
ENTRYPOINT_LIMIT = 200  # characters of a job's entrypoint kept (a status page, not a log)


def live_ray_jobs(
    jobs: Iterable[Mapping[str, Any]],
    actors: Iterable[Mapping[str, Any]],
    placement_groups: Iterable[Mapping[str, Any]],
    tasks: Iterable[Mapping[str, Any]],
) -> list[RayJob]:
    """Each live job of ``jobs`` with the CPUs and GPUs its driver and its work hold."""
    live = [j for j in jobs if j.get("status") in LIVE_STATUSES]
    holds: dict[str, dict[str, float]] = {_key(j): dict.fromkeys(RESOURCES, 0.0) for j in live}
    by_job_id = {str(j["job_id"]): _key(j) for j in live if j.get("job_id")}

    def add(key: str | None, resources: Mapping[str, Any] | None) -> None:
        if key in holds:
            for resource in RESOURCES:
                holds[key][resource] += float((resources or {}).get(resource, 0.0) or 0.0)

    for actor in actors:
        if actor.get("state") != "ALIVE":
            continue
        name = str(actor.get("name") or "")
        if name.startswith(SUPERVISOR_PREFIX):  # a submission's driver: its entrypoint resources
            add(f"submission:{name.removeprefix(SUPERVISOR_PREFIX)}", actor.get("required_resources"))
        elif not actor.get("placement_group_id"):  # one in a placement group uses the group's bundles
            add(by_job_id.get(str(actor.get("job_id"))), actor.get("required_resources"))
    for group in placement_groups:
        if group.get("state") == "CREATED":
            for bundle in group.get("bundles") or []:
                add(by_job_id.get(str(group.get("creator_job_id"))), bundle.get("unit_resources"))
    for task in tasks:
        if task.get("state") == "RUNNING" and task.get("type") == "NORMAL_TASK" and not task.get("placement_group_id"):
            add(by_job_id.get(str(task.get("job_id"))), task.get("required_resources"))

    return [
        RayJob(
            submission_id=j.get("submission_id") or None,
            job_id=j.get("job_id") or None,
            kind="submission" if j.get("submission_id") else "driver",
            status=str(j["status"]),
            entrypoint=str(j.get("entrypoint") or "")[:ENTRYPOINT_LIMIT],
            holds={r: round(amount, 6) for r, amount in holds[_key(j)].items() if amount},
        )
        for j in live
    ]


def _key(job: Mapping[str, Any]) -> str:
    return f"submission:{job['submission_id']}" if job.get("submission_id") else f"driver:{job.get('job_id')}"
