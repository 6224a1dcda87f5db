"""Bad nodes, docs/jobs.md "Bad nodes": a node blamed for two hangs or stragglers within the window is kept out of
the next attempts' placement for the cool-down, shown in ``GET /v1/cluster`` and cleared by a cluster admin (the
fake cluster; Ray's label selector on the real one: tests/integration/test_hangs_on_ray.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select

from orchestrator.admission import scaling_demand
from orchestrator.backend import ClusterNode, RunStatus
from orchestrator.db.models import Job, NodeFault
from orchestrator.services.bad_nodes import avoid_nodes, bad_nodes, excluded_until, node_of_rank
from orchestrator_contract.jobs import DriverExit, ScalingSpec
from tests.unit.api_helpers import ADMIN, auth, blame_node, driver_exits, make_project, run_token, submit, tick
from tests.unit.test_deadlines import SWEEP_BODY, running
from tests.unit.test_hangs import HUNG_SPEC, age, metric, post, reconcile, stacks_of, wanted
from tests.unit.test_stragglers import window

T0 = datetime(2026, 11, 29, 12, tzinfo=UTC)
HOUR = timedelta(hours=1)


def at(*minutes: float) -> list[datetime]:
    return [T0 + timedelta(minutes=m) for m in minutes]


def test_two_faults_within_the_window_exclude_until_the_cooldown_after_the_second():
    assert excluded_until(at(0), 2, HOUR, HOUR) is None
    assert excluded_until(at(0, 61), 2, HOUR, HOUR) is None  # an hour and a minute apart
    assert excluded_until(at(0, 60), 2, HOUR, HOUR) == T0 + timedelta(minutes=120)
    assert excluded_until(at(0, 30, 200), 2, HOUR, HOUR) == T0 + timedelta(minutes=90)  # the last alone earns none
    assert excluded_until(at(0, 30, 200, 210), 2, HOUR, HOUR) == T0 + timedelta(minutes=270)
    assert excluded_until(at(0), 1, HOUR, HOUR) == T0 + HOUR
    assert excluded_until(at(0, 10), 3, HOUR, HOUR) is None


def nodes(**cpus: float) -> list[ClusterNode]:
    return [ClusterNode(node_id=name, address="127.0.0.1", is_head=False, total={"CPU": n}) for name, n in cpus.items()]


def test_bad_nodes_are_avoided_only_while_the_other_nodes_hold_the_job():
    two_workers = scaling_demand(ScalingSpec(num_workers=2, cpus_per_worker=1))
    assert avoid_nodes({"b"}, nodes(a=1, b=1, c=1), two_workers) == ["b"]
    assert avoid_nodes({"b", "c"}, nodes(a=1, b=1, c=1), two_workers) == []  # a alone cannot hold 2 workers
    assert avoid_nodes({"a", "b"}, nodes(a=4, b=4), two_workers) == []  # every node is bad
    assert avoid_nodes({"gone"}, nodes(a=2), two_workers) == []
    big_worker = scaling_demand(ScalingSpec(num_workers=1, cpus_per_worker=3))
    assert avoid_nodes({"b"}, nodes(a=2, b=4, c=2), big_worker) == []  # 4 CPUs left, but no node holds 3


NODES = ["node-head", "node-a", "node-b"]


def straggling_on(app, client, backend, nodes: list[str]) -> str:
    """A 2-rank job whose rank 1 (on ``nodes[1]``) straggles for three windows; returns its id."""
    job_id, token = running(app, client, backend, scaling={"num_workers": 2, "cpus_per_worker": 0.5})
    post(client, job_id, token, 1, {"type": "state", "state": "running", "rank_nodes": nodes})
    reconcile(app)  # Ray confirms where the job's workers run
    post(client, job_id, token, 1, *(window(10 * i, [0.1, 0.5]) for i in range(1, 4)))
    return job_id


def cluster(client, key: str = ADMIN) -> dict:
    response = client.get("/v1/cluster", headers=auth(key))
    assert response.status_code == 200, response.text
    return response.json()


def assignment(client, backend, job_id: str) -> dict:
    token = run_token(client, backend, f"{job_id}-1")
    response = client.get(f"/internal/v1/jobs/{job_id}/assignment", params={"attempt": 1}, headers=auth(token))
    assert response.status_code == 200, response.text
    return response.json()


def test_a_node_that_straggled_twice_is_avoided_shown_and_cleared_by_a_cluster_admin(app, client, backend):
    backend.node_ids = list(NODES)
    straggling_on(app, client, backend, ["node-head", "node-a"])
    assert cluster(client)["bad_nodes"] == []  # one fault: not yet
    second = straggling_on(app, client, backend, ["node-b", "node-a"])
    (bad,) = cluster(client)["bad_nodes"]
    assert bad["node_id"] == "node-a" and [f["kind"] for f in bad["faults"]] == ["straggler", "straggler"]
    assert bad["faults"][1]["job_id"] == second and "rank 1: 5.0x the median" in bad["faults"][1]["message"]
    first_fault = datetime.fromisoformat(bad["faults"][1]["created_at"])
    assert timedelta(minutes=59) < datetime.fromisoformat(bad["excluded_until"]) - first_fault <= HOUR

    # A new job's attempt is told to keep off node-a; while node-a is the only node, nothing is avoided.
    fresh = submit(client, ADMIN, scaling={"num_workers": 1}).json()["id"]
    tick(app)
    assert assignment(client, backend, fresh)["avoid_nodes"] == ["node-a"]
    backend.node_ids = ["node-a"]
    assert assignment(client, backend, fresh)["avoid_nodes"] == []
    backend.node_ids = list(NODES)

    # Only a cluster-wide admin clears it; then it is placed on again. A node with nothing to clear is a 404.
    _, keys = make_project(client, "vision")
    member = keys["member"]
    assert client.delete("/v1/cluster/bad-nodes/node-a", headers=auth(member)).status_code == 403
    assert client.delete("/v1/cluster/bad-nodes/node-a", headers=auth(ADMIN)).status_code == 204
    assert cluster(client)["bad_nodes"] == []
    assert assignment(client, backend, fresh)["avoid_nodes"] == []
    missing = client.delete("/v1/cluster/bad-nodes/node-a", headers=auth(ADMIN))
    assert missing.status_code == 404 and "no hang or straggler to clear" in missing.text


def test_a_hang_blames_the_nodes_of_the_ranks_outside_a_collective(app, client, backend):
    backend.node_ids = list(NODES)
    job_id, token = running(app, client, backend, **HUNG_SPEC)
    post(client, job_id, token, 1, {"type": "state", "state": "running", "rank_nodes": ["node-a", "node-b"]})
    reconcile(app)
    post(client, job_id, token, 1, metric(1))
    age(app, job_id, 11)
    reconcile(app)
    request = wanted(client, job_id, token, 1)
    post(client, job_id, token, 1, stacks_of(0, request, False, "train.py:9 in main"), stacks_of(1, request, True))
    reconcile(app)  # ended hung: rank 0 was elsewhere, rank 1 waited for it
    assert client.get(f"/v1/jobs/{job_id}", headers=auth(ADMIN)).json()["reason"] == "hung"
    with app.state.service.sessions() as session:
        assert bad_nodes(session, app.state.service.settings) == []  # one fault is not enough
        faults = [(f.node_id, f.kind, f.attempt) for f in session.scalars(select(NodeFault).order_by(NodeFault.id))]
    assert faults == [("node-a", "hung", 1)]


@pytest.mark.parametrize("nodes", [["x"] * 1025, ["x" * 129]])
def test_a_running_report_with_too_many_or_too_long_node_ids_is_refused(app, client, backend, nodes):
    job_id, token = running(app, client, backend)
    response = client.post(
        f"/internal/v1/jobs/{job_id}/events",
        json={"attempt": 1, "events": [{"type": "state", "state": "running", "rank_nodes": nodes}]},
        headers=auth(token),
    )
    assert response.status_code == 422, response.text


def test_a_project_sees_every_bad_node_but_only_its_own_jobs_faults(app, client, backend):
    backend.node_ids = list(NODES)
    straggling_on(app, client, backend, ["node-head", "node-a"])
    straggling_on(app, client, backend, ["node-b", "node-a"])  # both the admin's (default project) jobs
    _, keys = make_project(client, "vision")
    (seen,) = cluster(client, keys["member"])["bad_nodes"]
    assert (seen["node_id"], seen["fault_count"], seen["faults"]) == ("node-a", 2, [])
    (everything,) = cluster(client)["bad_nodes"]
    assert everything["fault_count"] == 2 and len(everything["faults"]) == 2


RESTART = {
    "scaling": {"num_workers": 2, "cpus_per_worker": 0.5},
    "failure": {"on_straggler": "restart"},
    "retries": {"max_attempts": 2},
}


def control(client, job_id: str, token: str, attempt: int) -> dict:
    response = client.get(f"/internal/v1/jobs/{job_id}/control", params={"attempt": attempt}, headers=auth(token))
    assert response.status_code == 200, response.text
    return response.json()


def test_on_straggler_restart_checkpoints_stops_and_places_the_next_attempt_without_its_node(app, client, backend):
    backend.node_ids = list(NODES)
    job_id, token = running(app, client, backend, **RESTART)
    post(client, job_id, token, 1, {"type": "state", "state": "running", "rank_nodes": ["node-head", "node-a"]})
    reconcile(app)
    post(client, job_id, token, 1, *(window(10 * i, [0.1, 0.5]) for i in range(1, 4)))
    asked = client.get(f"/v1/jobs/{job_id}", headers=auth(ADMIN)).json()
    assert (asked["state"], asked["reason"]) == ("RUNNING", "straggler_restart"), asked
    assert "attempt 2 of 2 will be placed without rank 1's node node-a" in asked["message"], asked["message"]
    assert control(client, job_id, token, 1)["checkpoint_now"] is True
    # No second ask while it stops.
    post(client, job_id, token, 1, *(window(40 + 10 * i, [0.1, 0.5]) for i in range(3)))

    driver_exits(app, backend, f"{job_id}-1", status=RunStatus.FAILED, exit_code=DriverExit.PREEMPTED)
    body = client.get(f"/v1/jobs/{job_id}", headers=auth(ADMIN)).json()
    assert (body["state"], body["reason"], body["attempt"]) == ("RESTARTING", "straggler_restarted", 2), body
    assert backend.submitted[-1][0] == f"{job_id}-2"
    token2 = run_token(client, backend, f"{job_id}-2")
    assert control(client, job_id, token2, 2)["checkpoint_now"] is False  # the new attempt is not asked to stop
    got = client.get(f"/internal/v1/jobs/{job_id}/assignment", params={"attempt": 2}, headers=auth(token2)).json()
    assert got["avoid_nodes"] == ["node-a"]  # one fault: not a bad node, but this job keeps off it

    # Attempt 2 straggles too: no attempts left, so it only warns and trains on.
    post(client, job_id, token2, 2, {"type": "state", "state": "running", "rank_nodes": ["node-head", "node-b"]})
    backend.runs[f"{job_id}-2"] = RunStatus.RUNNING
    post(client, job_id, token2, 2, *(window(10 * i, [0.1, 0.5]) for i in range(1, 4)))
    body = client.get(f"/v1/jobs/{job_id}", headers=auth(ADMIN)).json()
    assert (body["state"], body["reason"]) == ("RUNNING", "straggler"), body
    assert control(client, job_id, token2, 2)["checkpoint_now"] is False
    reasons = [e["reason"] for e in client.get(f"/v1/jobs/{job_id}/events", headers=auth(ADMIN)).json()]
    assert reasons.count("straggler_restart") == 1 and reasons.count("straggler_restarted") == 1, reasons


def test_warn_keeps_training_and_avoids_nothing_of_its_own(app, client, backend):
    backend.node_ids = list(NODES)
    job_id = straggling_on(app, client, backend, ["node-head", "node-a"])
    body = client.get(f"/v1/jobs/{job_id}", headers=auth(ADMIN)).json()
    assert (body["state"], body["reason"]) == ("RUNNING", "straggler"), body
    assert assignment(client, backend, job_id)["avoid_nodes"] == []


def test_a_node_ray_does_not_list_for_the_job_is_never_blamed(app, client, backend):
    """The ranks' nodes are the run's word until Ray confirms them: a run naming a node its workers are not on (to
    get it kept out of everyone's placement) blames nothing, and neither does a report Ray was not asked about yet."""
    backend.node_ids = list(NODES)
    job_id, token = running(app, client, backend, scaling={"num_workers": 2, "cpus_per_worker": 0.5})
    backend.worker_node_ids[f"{job_id}-1"] = {"node-head"}  # where Ray has its workers
    post(client, job_id, token, 1, {"type": "state", "state": "running", "rank_nodes": ["node-head", "node-b"]})
    post(client, job_id, token, 1, *(window(10 * i, [0.1, 0.5]) for i in range(1, 4)))  # flagged before any check
    with app.state.service.sessions() as session:
        assert session.scalars(select(NodeFault)).all() == []
        assert not session.get(Job, job_id).rank_nodes.get("verified")
    reconcile(app)
    with app.state.service.sessions() as session:
        job = session.get(Job, job_id)
        assert job.rank_nodes == {"attempt": 1, "nodes": ["node-head", ""], "verified": True}
        assert node_of_rank(job, 0) == "node-head" and node_of_rank(job, 1) is None


def test_a_sweeps_trials_avoid_the_bad_nodes_the_sweep_assignment_names(app, client, backend):
    """Sweep trials are placed by Ray Tune, each a Ray Train run: the sweep driver's assignment names the bad nodes,
    and every trial's ScalingConfig keeps off them (``workers.tune.tuner._trainer``), under the jobs' rule."""
    backend.node_ids = list(NODES)
    blame_node(app.state.service.sessions, "node-a", "some-job")
    sweep_id, _ = running(app, client, backend, "sweeps", **SWEEP_BODY)
    token = run_token(client, backend, f"{sweep_id}-1")
    answer = client.get(f"/internal/v1/sweeps/{sweep_id}/assignment", params={"attempt": 1}, headers=auth(token))
    assert answer.status_code == 200, answer.text
    assert answer.json()["avoid_nodes"] == ["node-a"]
    backend.node_ids = ["node-a"]  # the only node: the sweep would wait for ever, so nothing is avoided
    answer = client.get(f"/internal/v1/sweeps/{sweep_id}/assignment", params={"attempt": 1}, headers=auth(token))
    assert answer.json()["avoid_nodes"] == []


def test_a_trials_train_run_keeps_off_the_nodes_it_is_given(tmp_path):
    from ray.train import UserCallback

    from orchestrator_contract.jobs import JobSpec
    from workers.tune.tuner import _trainer

    spec = JobSpec.model_validate(SWEEP_BODY["base"])
    trainer = _trainer(spec, "trial-1", str(tmp_path), UserCallback(), avoid_nodes=["node-a", "node-b"])
    assert trainer.scaling_config.label_selector == {"ray.io/node-id": "!in(node-a,node-b)"}
    assert not _trainer(spec, "trial-1", str(tmp_path), UserCallback()).scaling_config.label_selector
