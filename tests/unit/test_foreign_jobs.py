"""Ray jobs the control plane did not submit (docs/clusters.md, "Ray jobs the control plane did not submit"): what
each holds, read from Ray's own lists (recorded from Ray 2.60); which are ours, by asking the database; and that
the scheduler keeps what they hold out of what it hands out while GET /v1/cluster lists them to admins. The same
on a real Ray cluster: tests/integration/test_clusters_on_ray.py."""

from __future__ import annotations

from fastapi.testclient import TestClient

from orchestrator.backend import RayJob
from orchestrator.backend.ray_jobs import live_ray_jobs
from orchestrator.db.models import Job
from orchestrator.repositories import projects as projects_repo
from orchestrator.services.foreign_jobs import foreign_jobs, held_by
from tests.unit.api_helpers import ADMIN, auth, make_project, submit, tick
from tests.unit.test_cluster_placement import bind, job, second, two_clusters  # noqa: F401  (fixtures)
from tests.unit.ui_helpers import signed_in

# Recorded from a Ray 2.60 head (3 CPUs): submission "foreign-2" (entrypoint 0.5 CPU) made an actor of 0.5 CPU,
# a plain actor (holds nothing), a placement group of 0.25 CPU and a 1-CPU task; a driver that connected itself
# runs a 0.25-CPU task; "foreign-1" has ended. Its dashboard's own job (01000000, unlisted) made the supervisors.
JOBS = [
    {
        "type": "SUBMISSION",
        "job_id": None,
        "submission_id": "foreign-1",
        "status": "FAILED",
        "entrypoint": "python a.py",
    },
    {
        "type": "SUBMISSION",
        "job_id": "02000000",
        "submission_id": "foreign-2",
        "status": "RUNNING",
        "entrypoint": "python b.py",
    },
    {
        "type": "DRIVER",
        "job_id": "03000000",
        "submission_id": None,
        "status": "RUNNING",
        "entrypoint": "python -c 'import ray'",
    },
]
ACTORS = [
    {
        "class_name": "A",
        "state": "ALIVE",
        "job_id": "02000000",
        "name": "",
        "required_resources": {"CPU": 0.5},
        "placement_group_id": None,
    },
    {
        "class_name": "B",
        "state": "ALIVE",
        "job_id": "02000000",
        "name": "",
        "required_resources": {},
        "placement_group_id": None,
    },
    {
        "class_name": "JobSupervisor",
        "state": "ALIVE",
        "job_id": "01000000",
        "name": "_ray_internal_job_actor_foreign-2",
        "ray_namespace": "SUPERVISOR_ACTOR_RAY_NAMESPACE",
        "required_resources": {"CPU": 0.5},
        "placement_group_id": None,
    },
    # An actor inside the placement group: the group's bundle is what holds it, counted once.
    {
        "class_name": "InGroup",
        "state": "ALIVE",
        "job_id": "02000000",
        "name": "",
        "required_resources": {"CPU": 0.25},
        "placement_group_id": "47caab8b911a73beb774dab4b64502000000",
    },
    # A Serve replica the dashboard's own job started for a deployment of ours: not any listed job's.
    {
        "class_name": "ServeReplica:app:Model",
        "state": "ALIVE",
        "job_id": "01000000",
        "name": "SERVE_REPLICA::app#x",
        "ray_namespace": "serve",
        "required_resources": {"CPU": 1.0},
        "placement_group_id": None,
    },
]
PLACEMENT_GROUPS = [
    {
        "placement_group_id": "47caab8b911a73beb774dab4b64502000000",
        "creator_job_id": "02000000",
        "state": "CREATED",
        "bundles": [{"unit_resources": {"CPU": 0.25}}],
    },
]
TASKS = [
    {"name": "hold", "state": "RUNNING", "job_id": "02000000", "type": "NORMAL_TASK", "required_resources": {"CPU": 1.0}, "placement_group_id": None},
    {"name": "h", "state": "RUNNING", "job_id": "03000000", "type": "NORMAL_TASK", "required_resources": {"CPU": 0.25}, "placement_group_id": None},
    {"name": "A.ping", "state": "RUNNING", "job_id": "02000000", "type": "ACTOR_TASK", "required_resources": {}, "placement_group_id": None},
]  # fmt: skip


def test_each_live_jobs_holdings_are_its_driver_actors_groups_and_tasks_each_counted_once():
    jobs = live_ray_jobs(JOBS, ACTORS, PLACEMENT_GROUPS, TASKS)
    assert [(j.name, j.kind, j.holds) for j in jobs] == [
        ("foreign-2", "submission", {"CPU": 2.25}),  # 0.5 driver + 0.5 actor + 0.25 group + 1 task
        ("driver:03000000", "driver", {"CPU": 0.25}),
    ]
    assert held_by(jobs) == {"CPU": 2.5, "GPU": 0.0}


def ray_job(submission_id: str | None, cpus: float = 1.0, job_id: str = "05000000") -> RayJob:
    kind = "submission" if submission_id else "driver"
    return RayJob(submission_id, job_id, kind, "RUNNING", "python x.py", {"CPU": cpus})


def test_a_submission_is_ours_only_for_a_run_of_ours_on_that_cluster_at_an_attempt_it_reached(app, sessions):
    with sessions.begin() as session:
        project_id = projects_repo.ensure_default_project(session).id
        mine, elsewhere = (
            Job(project_id=project_id, workload="digits", spec={}, token_hash="", attempt=attempt, cluster=cluster)
            for attempt, cluster in ((2, "local"), (1, "b"))
        )
        session.add_all([mine, elsewhere])
        session.flush()
        mine_id, elsewhere_id = mine.id, elsewhere.id
    live = [
        ray_job(f"{mine_id}-1"),
        ray_job(f"{mine_id}-2"),
        ray_job(f"{mine_id}-3"),  # an attempt it has not reached: someone took the id first
        ray_job(f"{elsewhere_id}-1"),  # a run of cluster b's, seen on local
        ray_job("my-own-experiment"),
        ray_job(None, job_id="06000000"),
    ]
    with sessions() as session:
        foreign = foreign_jobs(session, {"local": live}, "local")["local"]
    assert [j.name for j in foreign] == [
        f"{mine_id}-3",
        f"{elsewhere_id}-1",
        "my-own-experiment",
        "driver:06000000",
    ]


def test_what_foreign_jobs_hold_is_not_admitted_twice_and_only_admins_see_them(two_clusters, client, second):  # noqa: F811
    project_id, keys = make_project(client, "vision")
    bind(client, project_id, "b")
    second.ray_jobs = [ray_job("someones-notebook", cpus=1.5)]  # b has 2 CPUs
    big = submit(client, keys["member"], scaling={"num_workers": 1, "cpus_per_worker": 1}).json()["id"]
    tick(two_clusters)
    waiting = job(client, big)
    assert waiting["state"] == "QUEUED" and waiting["reason"] == "insufficient_resources"
    assert "needs 1 CPU, 0.5 free" in waiting["message"]
    assert "1.5 CPU held by Ray jobs the control plane did not submit" in waiting["message"]

    admin_view = {c["name"]: c for c in client.get("/v1/cluster", headers=auth(ADMIN)).json()["clusters"]}
    assert admin_view["b"]["available"]["CPU"] == 0.5 and admin_view["b"]["held_outside"] == {"CPU": 1.5}
    assert [(f["id"], f["kind"], f["holds"]) for f in admin_view["b"]["foreign"]] == [
        ("someones-notebook", "submission", {"CPU": 1.5})
    ]
    assert admin_view["local"]["foreign"] == [] and admin_view["local"]["held_outside"] == {}
    member_view = client.get("/v1/cluster", headers=auth(keys["member"])).json()["clusters"]
    assert member_view[0]["held_outside"] == {"CPU": 1.5} and member_view[0]["foreign"] == []

    # The dashboard's clusters table: the amount to everyone, the job itself to admins.
    admin_page = signed_in(TestClient(two_clusters), ADMIN).get("/ui/cluster").text
    member_page = signed_in(TestClient(two_clusters), keys["member"]).get("/ui/cluster").text
    assert "1.5 CPU" in admin_page and "someones-notebook" in admin_page
    assert "1.5 CPU" in member_page and "someones-notebook" not in member_page

    second.ray_jobs = []  # it ended: its CPUs are the scheduler's again
    tick(two_clusters)
    assert job(client, big)["state"] == "STARTING"
