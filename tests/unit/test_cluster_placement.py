"""Several Ray clusters behind one control plane (docs/clusters.md), on fake clusters: which cluster a run goes to,
that every Ray call for it reaches that cluster and no other, and what happens when one can't be reached. The
same on two real Ray clusters: tests/integration/test_clusters_on_ray.py."""

from __future__ import annotations

import pytest

from orchestrator.admission import ClusterCapacity, Demand
from orchestrator.loops.serving import ServingReconciler
from orchestrator.scheduling.placement import ClusterView, ToPlace, place, quotas_here
from orchestrator.scheduling.policy import Holding, ProjectQuota
from orchestrator_contract.placement import Placement
from tests.fakes import FakeBackend
from tests.unit.api_helpers import ADMIN, auth, make_project, reconcile, submit, tick
from tests.unit.test_deployments import deploy, finished_job

ONE_CPU = {"num_workers": 1, "cpus_per_worker": 1}


# --- the placement rule alone ---------------------------------------------------------------------------


def view(name: str, cpus: float | None, **labels: str) -> ClusterView:
    capacity = None if cpus is None else ClusterCapacity({"CPU": cpus, "GPU": 0.0}, {"CPU": cpus, "GPU": 0.0})
    return ClusterView(name, labels, capacity, "" if cpus is not None else "connection refused")


def run(key: str, cpus: float = 1, project: str = "p", placement: Placement | None = None, pinned=None) -> ToPlace:
    demand = Demand({"CPU": cpus, "GPU": 0.0}, {"CPU": cpus, "GPU": 0.0}, f"{cpus} CPU")
    return ToPlace(key, project, demand, placement, pinned)


def test_a_run_goes_where_it_fits_now_the_freest_first_and_an_earlier_pick_takes_its_room():
    views = {"a": view("a", 4), "b": view("b", 2)}
    held = [Holding("job:x", "p", {"CPU": 3.0}, cluster="a")]  # a has 1 free, b has 2
    placed = place([run("r1"), run("r2"), run("r3", cpus=2)], views, held, {"p": {"a", "b"}}, "a")
    assert placed.cluster["r1"] == "b"  # 2 free beats 1
    assert placed.cluster["r2"] == "a"  # b has 1 left, a has 1: a tie goes to the first name
    assert placed.cluster["r3"] == "a"  # fits nowhere now: where it could ever fit, the most capacity
    assert placed.waits == {}


def test_a_project_with_no_binding_uses_the_default_cluster_only_and_labels_pick_among_its_clusters():
    views = {"local": view("local", 1), "gpu": view("gpu", 8, pool="gpu"), "cpu": view("cpu", 8, pool="cpu")}
    bound = {"team": {"gpu", "cpu"}}
    placed = place(
        [run("free", project="other"), run("labelled", project="team", placement=Placement(labels={"pool": "cpu"}))],
        views,
        [],
        bound,
        "local",
    )
    assert placed.cluster == {"free": "local", "labelled": "cpu"}


def test_a_run_placed_before_stays_and_one_with_no_usable_cluster_waits_saying_which_it_may_use():
    views = {"a": view("a", 4), "b": view("b", 4)}
    bound = {"p": {"a", "b"}}
    nowhere = run("nowhere", placement=Placement(cluster="c"))
    placed = place([run("pinned", pinned="b"), nowhere], views, [], bound, "a")
    assert placed.cluster == {"pinned": "b"}
    reason, message = placed.waits["nowhere"]
    assert reason == "no_cluster" and "cluster 'c'" in message and "a, b" in message


def test_an_unreachable_cluster_holds_only_the_runs_that_must_go_there():
    views = {"a": view("a", None), "b": view("b", 4)}
    placed = place([run("either"), run("only-a", placement=Placement(cluster="a"))], views, [], {"p": {"a", "b"}}, "a")
    assert placed.cluster == {"either": "b"}
    reason, message = placed.waits["only-a"]
    assert reason == "cluster_unavailable" and "a" in message and "connection refused" in message


def test_a_projects_cap_on_a_cluster_sends_its_next_runs_elsewhere_and_binds_there():
    views = {"a": view("a", 8), "b": view("b", 2)}
    quotas = {"p": ProjectQuota("p", max_cpus=10, per_cluster={"a": {"max_cpus": 1}})}
    held = [Holding("job:x", "p", {"CPU": 1.0}, cluster="a")]  # p is at its cap on a, which has 7 free
    placed = place(
        [run("r1"), run("r2"), run("r3"), run("q", project="q")],
        views,
        held,
        {"p": {"a", "b"}, "q": {"a"}},
        "a",
        quotas,
    )
    assert placed.cluster == {"r1": "b", "r2": "b", "r3": "b", "q": "a"}  # r3 waits on b; q has no cap
    without = place([run("r1")], views, held, {"p": {"a", "b"}}, "a")  # no quotas given: the freest
    assert without.cluster == {"r1": "a"}
    # On the capped cluster the cap is p's quota there, the lower of the two; elsewhere its quota is unchanged.
    here = quotas_here(quotas, [Holding("job:y", "p", {"CPU": 2.0}, cluster="b")], "a")["p"]
    assert here.max_cpus == 1 and "on cluster a" in here.label
    assert quotas_here(quotas, [], "b")["p"].max_cpus == 10


def test_a_placement_names_a_cluster_or_labels_and_a_missing_label_never_matches():
    with pytest.raises(ValueError, match="not both"):
        Placement(cluster="a", labels={"gpu": "h100"})
    assert not Placement(labels={"gpu": "None"}).matches("a", {})
    assert Placement(labels={"gpu": "h100"}).matches("a", {"gpu": "h100", "region": "eu"})


# --- through the service, on two fake clusters -------------------------------------------------------------


@pytest.fixture
def second() -> FakeBackend:
    """Cluster b's Ray (2 CPUs); the default cluster ("local") is the ``backend`` fixture's."""
    return FakeBackend(total={"CPU": 2.0, "GPU": 0.0})


@pytest.fixture
def two_clusters(app, client, second):
    """Cluster b registered; the control plane reaches it through ``second``."""
    app.state.service.backends.connect = lambda address, token: second
    body = {"name": "b", "address": "http://b-head:8265", "labels": {"pool": "b"}, "serve_url": "http://b-serve:8000"}
    response = client.post("/v1/clusters", json=body, headers=auth(ADMIN))
    assert response.status_code == 201, response.text
    return app


def bind(client, project_id: str, *clusters: str) -> None:
    response = client.put(f"/v1/projects/{project_id}/clusters", json={"clusters": list(clusters)}, headers=auth(ADMIN))
    assert response.status_code == 200, response.text


def job(client, job_id: str) -> dict:
    return client.get(f"/v1/jobs/{job_id}", headers=auth(ADMIN)).json()


def test_a_project_bound_to_b_runs_there_and_every_ray_call_for_it_goes_to_b(two_clusters, client, backend, second):
    project_id, keys = make_project(client, "vision")
    bind(client, project_id, "b")
    job_id = submit(client, keys["member"], scaling=ONE_CPU).json()["id"]
    assert job(client, job_id)["cluster"] is None  # not placed while it waits
    tick(two_clusters)
    assert job(client, job_id)["cluster"] == "b"
    assert [s[0] for s in second.submitted] == [f"{job_id}-1"] and backend.submitted == []
    backend.asked.clear()
    second.asked.clear()
    reconcile(two_clusters)  # asks b about it, never the default cluster
    assert "info" in second.asked and "info" not in backend.asked
    second.log_texts[f"{job_id}-1"] = "hello from b\n"
    logs = client.get(f"/v1/jobs/{job_id}/logs", headers=auth(keys["member"]))
    assert "hello from b" in logs.text
    assert client.post(f"/v1/jobs/{job_id}/cancel", headers=auth(keys["member"])).status_code == 200
    assert second.stopped == [f"{job_id}-1"] and backend.stopped == []


def test_a_spec_naming_a_cluster_its_project_may_not_use_is_a_422_naming_those_it_may(two_clusters, client):
    project_id, keys = make_project(client, "vision")
    bind(client, project_id, "b")
    response = submit(client, keys["member"], scaling=ONE_CPU, placement={"cluster": "local"})
    assert response.status_code == 422
    assert "'local' is not among the clusters this project may use: b (pool=b)" in response.text
    # an unbound project may use the default cluster only
    _, other = make_project(client, "speech")
    refused = submit(client, other["member"], scaling=ONE_CPU, placement={"labels": {"pool": "b"}})
    assert refused.status_code == 422 and "local" in refused.text
    sweep = {
        "base": {"workload": "digits", "scaling": ONE_CPU},
        "search_space": {"lr.base": {"type": "choice", "values": [0.1]}},
    }
    refused = client.post("/v1/sweeps", json={**sweep, "placement": {"cluster": "b"}}, headers=auth(other["member"]))
    assert refused.status_code == 422 and "'b' is not among" in refused.text


def test_a_run_placed_by_labels_and_one_too_big_for_every_cluster_it_may_use(two_clusters, client, second):
    project_id, keys = make_project(client, "vision")
    bind(client, project_id, "b", "local")
    job_id = submit(client, keys["member"], scaling=ONE_CPU, placement={"labels": {"pool": "b"}}).json()["id"]
    tick(two_clusters)
    assert job(client, job_id)["cluster"] == "b"
    too_big = submit(client, keys["member"], scaling={"num_workers": 8, "cpus_per_worker": 1})
    assert too_big.status_code == 422 and "any of the clusters it may use" in too_big.text


def test_with_b_unreachable_its_runs_wait_and_the_others_go_on(two_clusters, client, backend, second):
    project_id, keys = make_project(client, "vision")
    bind(client, project_id, "b", "local")
    on_b = submit(client, keys["member"], scaling=ONE_CPU, placement={"cluster": "b"}).json()["id"]
    tick(two_clusters)
    second.available = False
    waits = submit(client, keys["member"], scaling=ONE_CPU, placement={"cluster": "b"}).json()["id"]
    moves = submit(client, keys["member"], scaling=ONE_CPU).json()["id"]
    tick(two_clusters)
    assert job(client, waits)["state"] == "QUEUED" and job(client, waits)["reason"] == "cluster_unavailable"
    assert job(client, moves)["cluster"] == "local" and job(client, moves)["state"] == "STARTING"
    reconcile(two_clusters)  # b's run is left as it is, the default cluster's is reconciled
    assert job(client, on_b)["state"] == "STARTING"
    second.available = True
    tick(two_clusters)
    assert job(client, waits)["cluster"] == "b" and job(client, waits)["state"] == "STARTING"


def test_a_quota_counts_across_clusters(two_clusters, client, backend, second):
    backend.total = {"CPU": 2.0, "GPU": 0.0}  # as b: the first pick is a tie (by name: b), the second the freest
    project_id, keys = make_project(client, "vision")
    bind(client, project_id, "b", "local")
    response = client.put(
        f"/v1/projects/{project_id}/quota", json={"max_cpus": 2, "borrowing": False}, headers=auth(ADMIN)
    )
    assert response.status_code == 200, response.text
    ids = [submit(client, keys["member"], scaling=ONE_CPU).json()["id"] for _ in range(3)]
    tick(two_clusters)
    runs = [job(client, i) for i in ids]
    assert sorted(r["state"] for r in runs) == ["QUEUED", "STARTING", "STARTING"]  # 2 CPUs in all, not 2 on each
    waiting = next(r for r in runs if r["state"] == "QUEUED")
    assert waiting["reason"] == "quota_exceeded"
    assert "less 2 CPUs, 0 GPUs, 2 runs on its other clusters" in waiting["message"], waiting["message"]
    assert len(second.submitted) + len(backend.submitted) == 2


def test_a_deployment_on_b_is_served_by_bs_serve_and_its_url_says_so(two_clusters, client, backend, second, tmp_path):
    project_id, keys = make_project(client, "vision")
    bind(client, project_id, "b")
    _, checkpoints = finished_job(two_clusters, tmp_path, project_id)
    response = deploy(client, keys["member"], name="digits-b", source={"checkpoint_id": checkpoints[0]})
    assert response.status_code == 201, response.text
    assert response.json()["cluster"] == "b" and response.json()["url"] == "http://b-serve:8000/digits-b"
    service = two_clusters.state.service
    ServingReconciler(service.sessions, service.backends, service.settings).tick()
    assert [a["name"] for a in second.serve_applied[-1]["applications"]] == ["digits-b"]
    assert all(not c["applications"] for c in backend.serve_applied)  # the default cluster's Serve holds none
    # b's own Serve port (two clusters on one host): its proxy listens there, and with no serve_url its URL says so.
    moved = client.patch("/v1/clusters/b", json={"serve_port": 8123, "serve_url": None}, headers=auth(ADMIN))
    assert moved.status_code == 200 and moved.json()["serve_port"] == 8123, moved.text
    assert client.get("/v1/deployments/digits-b", headers=auth(keys["member"])).json()["url"] == (
        "http://b-head:8123/digits-b"
    )
    second.serve_applied.clear()
    second.serve_apps = {}  # Serve lost its apps (a head restart): the next tick applies the config again
    ServingReconciler(service.sessions, service.backends, service.settings).tick()
    assert second.serve_applied[-1]["http_options"]["port"] == 8123
    assert all(c["http_options"]["port"] == service.settings.serve_port for c in backend.serve_applied)


def test_a_project_bound_to_b_cannot_deploy_on_the_default_cluster(two_clusters, client, tmp_path):
    project_id, keys = make_project(client, "vision")
    bind(client, project_id, "b")
    _, checkpoints = finished_job(two_clusters, tmp_path, project_id)
    body = {"name": "digits-a", "source": {"checkpoint_id": checkpoints[0]}, "placement": {"cluster": "local"}}
    response = deploy(client, keys["member"], **body)
    assert response.status_code == 422 and "may use: b (pool=b)" in response.text, response.text


def test_get_cluster_lists_the_clusters_a_key_may_use_with_their_health(two_clusters, client, second):
    project_id, keys = make_project(client, "vision")
    bind(client, project_id, "b")
    mine = client.get("/v1/cluster", headers=auth(keys["member"])).json()["clusters"]
    assert [(c["name"], c["ray"], c["total"]["CPU"]) for c in mine] == [("b", "ok", 2.0)]
    second.available = False
    every = client.get("/v1/cluster", headers=auth(ADMIN)).json()["clusters"]
    assert {c["name"]: c["ray"] for c in every} == {"b": "unavailable", "local": "ok"}


def test_get_cluster_counts_each_clusters_queue_and_names_the_cluster_each_queued_job_waits_for(
    two_clusters, client, second
):
    project_id, keys = make_project(client, "vision")
    bind(client, project_id, "b")
    two = {"num_workers": 2, "cpus_per_worker": 1}  # b's 2 CPUs: the second waits on b
    running, waiting = (submit(client, keys["member"], scaling=two).json()["id"] for _ in range(2))
    on_default = submit(client, ADMIN, scaling={"num_workers": 1, "cpus_per_worker": 1}).json()["id"]
    queued_before = client.get("/v1/cluster", headers=auth(ADMIN)).json()["queue"]
    assert {q["id"]: q["waiting_on"] for q in queued_before} == {running: None, waiting: None, on_default: None}
    tick(two_clusters)
    status = client.get("/v1/cluster", headers=auth(ADMIN)).json()
    assert {c["name"]: (c["running"], c["queued"]) for c in status["clusters"]} == {"b": (1, 1), "local": (1, 0)}
    assert [(q["id"], q["waiting_on"]) for q in status["queue"]] == [(waiting, "b")]
    assert job(client, running)["cluster"] == "b"


def test_a_cap_on_one_cluster_is_set_checked_and_binds_there(two_clusters, client, backend, second):
    project_id, keys = make_project(client, "vision")
    bind(client, project_id, "b")
    quota = {"borrowing": False, "per_cluster": {"b": {"max_cpus": 1}}}
    unknown = client.put(
        f"/v1/projects/{project_id}/quota", json={**quota, "per_cluster": {"nope": {}}}, headers=auth(ADMIN)
    )
    assert unknown.status_code == 422 and "no cluster named nope" in unknown.text and "b, local" in unknown.text
    response = client.put(f"/v1/projects/{project_id}/quota", json=quota, headers=auth(ADMIN))
    assert response.status_code == 200, response.text
    shown = client.get(f"/v1/projects/{project_id}", headers=auth(ADMIN)).json()["quota"]["per_cluster"]
    assert shown == {"b": {"max_cpus": 1.0, "max_gpus": None, "max_running_jobs": None}}
    # Larger than its cap on every cluster it may use: a 422 at submit, saying which cap.
    refused = submit(client, keys["member"], scaling={"num_workers": 2, "cpus_per_worker": 1})
    assert refused.status_code == 422 and "caps on the clusters it may use: b:" in refused.text, refused.text
    # b has 2 CPUs, the cap 1: one job runs, the next waits saying why.
    ids = [submit(client, keys["member"], scaling=ONE_CPU).json()["id"] for _ in range(2)]
    tick(two_clusters)
    runs = [job(client, i) for i in ids]
    assert [r["state"] for r in runs] == ["STARTING", "QUEUED"] and len(second.submitted) == 1
    assert runs[1]["reason"] == "quota_exceeded" and "on cluster b" in runs[1]["message"], runs[1]["message"]
    assert backend.submitted == []  # never the default cluster, which the project is not bound to


def test_deleting_a_cluster_drops_every_projects_cap_on_it(two_clusters, client):
    project_id, _ = make_project(client, "vision")
    quota = {"max_cpus": 8, "per_cluster": {"b": {"max_gpus": 0}, "local": {"max_cpus": 2}}}
    assert client.put(f"/v1/projects/{project_id}/quota", json=quota, headers=auth(ADMIN)).status_code == 200
    assert client.delete("/v1/clusters/b", headers=auth(ADMIN)).status_code == 204
    shown = client.get(f"/v1/projects/{project_id}", headers=auth(ADMIN)).json()["quota"]
    assert shown["max_cpus"] == 8 and shown["per_cluster"] == {
        "local": {"max_cpus": 2.0, "max_gpus": None, "max_running_jobs": None}
    }


def test_the_dashboards_node_table_lists_each_clusters_nodes_under_its_name(two_clusters, client, second):
    from fastapi.testclient import TestClient

    from tests.unit.ui_helpers import signed_in

    project_id, keys = make_project(client, "vision")
    bind(client, project_id, "b", "local")
    member = signed_in(TestClient(two_clusters), keys["member"])
    nodes = member.get("/ui/api/cluster").json()["nodes"]
    assert sorted((n["cluster"], n["is_head"]) for n in nodes) == [("b", True), ("local", True)], nodes
    second.available = False  # b does not answer: its nodes go, the default cluster's stay
    nodes = member.get("/ui/api/cluster").json()["nodes"]
    assert [n["cluster"] for n in nodes] == ["local"], nodes
    html = member.get("/ui/cluster").text
    assert "<th>Cluster</th>" in html and '<td class="mono">local</td>' in html


def test_a_deployment_whose_replicas_could_never_fit_its_cap_on_its_cluster_is_a_422(
    two_clusters, client, second, tmp_path
):
    project_id, keys = make_project(client, "vision")
    bind(client, project_id, "b")
    quota = {"per_cluster": {"b": {"max_cpus": 1}}}
    assert client.put(f"/v1/projects/{project_id}/quota", json=quota, headers=auth(ADMIN)).status_code == 200
    _, checkpoints = finished_job(two_clusters, tmp_path, project_id)
    source = {"checkpoint_id": checkpoints[0]}
    refused = deploy(client, keys["member"], name="big", source=source, replicas=2, resources={"cpus": 1})
    assert refused.status_code == 422 and "on cluster b" in refused.text, refused.text
    made = deploy(client, keys["member"], name="fits", source=source, replicas=1, resources={"cpus": 1})
    assert made.status_code == 201 and made.json()["cluster"] == "b", made.text
    grow = client.patch("/v1/deployments/fits", json={"replicas": 2}, headers=auth(keys["member"]))
    assert grow.status_code == 422 and "on cluster b" in grow.text, grow.text
