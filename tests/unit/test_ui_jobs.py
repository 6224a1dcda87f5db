"""The dashboard's jobs pages and their JSON (/ui/jobs, /ui/jobs/{id}, /ui/api/jobs...): paging and filters,
project isolation on every page and endpoint, roles and CSRF on cancel and deploy, downsampled curves with
restarts, logs (tail, follow, search, download), the plan and the best checkpoint."""

from __future__ import annotations

import math
import re

import pytest
from fastapi.testclient import TestClient

from orchestrator.db.models import JobState
from tests.unit.api_helpers import ADMIN, auth, make_project
from tests.unit.ui_helpers import add_checkpoint, add_metrics, csrf, job_in, move_job, signed_in

S = JobState


@pytest.fixture
def settings_overrides() -> dict:
    return {"serve_port": 8123, "workload_packages": ""}


@pytest.fixture
def two_projects(app, client):
    """Projects a and b, a job in each, and a member client of a."""
    a, keys_a = make_project(client, "a")
    b, keys_b = make_project(client, "b")
    job_a, job_b = job_in(app, a, name="mine"), job_in(app, b, name="theirs")
    return {"a": a, "b": b, "keys_a": keys_a, "keys_b": keys_b, "job_a": job_a, "job_b": job_b}


def _endpoints(job_id: str, checkpoint_id: int = 1) -> list[tuple[str, str]]:
    """Every page and JSON route the jobs pages have for one job (GETs and POSTs)."""
    return [
        ("GET", f"/ui/jobs/{job_id}"),
        ("GET", f"/ui/jobs/{job_id}/logs/download"),
        ("GET", f"/ui/api/jobs/{job_id}"),
        ("GET", f"/ui/api/jobs/{job_id}/metrics"),
        ("GET", f"/ui/api/jobs/{job_id}/metrics?x=epoch"),
        ("GET", f"/ui/api/jobs/{job_id}/logs"),
        ("GET", f"/ui/api/jobs/{job_id}/logs?q=x"),
        ("POST", f"/ui/jobs/{job_id}/cancel"),
        ("POST", f"/ui/jobs/{job_id}/checkpoints/{checkpoint_id}/deploy"),
    ]


# --- isolation ---------------------------------------------------------------------------------------------


def test_another_projects_job_is_not_found_on_any_page_or_endpoint(app, client, two_projects, tmp_path):
    p = two_projects
    move_job(app, p["job_b"], S.STARTING, S.RUNNING, S.SUCCEEDED)
    add_metrics(app, p["job_b"], 1, range(20), lambda s: {"train_loss": 1.0 / (s + 1)})
    checkpoint_b = add_checkpoint(app, tmp_path, p["job_b"], 1, 0.9)
    for role in ("member", "viewer"):
        signed_in(client, p["keys_a"][role])
        token = csrf(client)
        for method, path in _endpoints(p["job_b"], checkpoint_b):
            data = {"csrf_token": token, "name": "stolen"}
            answer = client.get(path) if method == "GET" else client.post(path, data=data, follow_redirects=False)
            expected = 403 if method == "POST" and role == "viewer" else 404
            assert answer.status_code == expected, (role, path, answer.text[:200])
        assert client.get(f"/ui/jobs/{p['job_a']}").status_code == 200
    # Nothing of b in a's lists, whatever the filter says
    for query in ("", "?name=theirs", "?state=SUCCEEDED", "?limit=1"):
        assert p["job_b"] not in client.get(f"/ui/jobs{query}").text
        assert p["job_b"] not in client.get(f"/ui/api/jobs{query}").text
    assert p["job_a"] in client.get("/ui/jobs").text
    # b's deployment was never made, b's job was never cancelled
    assert client.get("/v1/deployments/stolen", headers=auth(ADMIN)).status_code == 404
    assert client.get(f"/v1/jobs/{p['job_b']}", headers=auth(ADMIN)).json()["state"] == "SUCCEEDED"


def test_a_cluster_admin_sees_every_project_until_it_picks_one(app, client, two_projects):
    p = two_projects
    signed_in(client, ADMIN)
    page = client.get("/ui/jobs").text
    assert p["job_a"] in page and p["job_b"] in page
    assert client.get(f"/ui/api/jobs/{p['job_b']}").status_code == 200
    client.post("/ui/project", data={"csrf_token": csrf(client), "project_id": p["a"]})
    page = client.get("/ui/jobs").text
    assert p["job_a"] in page and p["job_b"] not in page
    assert client.get(f"/ui/api/jobs/{p['job_b']}").status_code == 404
    assert client.get(f"/ui/jobs/{p['job_b']}").status_code == 404


# --- the list: paging and filters -------------------------------------------------------------------------


def test_the_list_pages_with_the_rest_cursor_and_keeps_filters_in_the_url(app, client):
    project, keys = make_project(client, "a")
    ids = [job_in(app, project, name=f"run-{i}", labels={"team": "x" if i % 2 else "y"}) for i in range(7)]
    signed_in(client, keys["viewer"])
    first = client.get("/ui/jobs?limit=2&label=team%3Dx")
    assert first.status_code == 200
    shown = re.findall(r'data-job-id="(\w+)"', first.text)
    assert shown == [ids[5], ids[3]]  # newest first, team=x only
    assert 'value="team=x"' in first.text  # the filter stays in the form
    next_url = re.search(r'href="(/ui/jobs\?[^"]+)" id="next-page"', first.text).group(1).replace("&amp;", "&")
    assert "label=team%3Dx" in next_url and "limit=2" in next_url and "cursor=" in next_url
    second = client.get(next_url)
    assert re.findall(r'data-job-id="(\w+)"', second.text) == [ids[1]]
    assert 'id="next-page"' not in second.text and "First page" in second.text
    # the JSON the page polls answers the same page
    data = client.get("/ui/api/jobs?limit=2&label=team%3Dx").json()
    assert [j["id"] for j in data["items"]] == [ids[5], ids[3]] and data["next_cursor"]
    # by state and by name
    move_job(app, ids[0], S.CANCELLED, reason="cancelled", message="by hand")
    assert re.findall(r'data-job-id="(\w+)"', client.get("/ui/jobs?state=CANCELLED").text) == [ids[0]]
    assert re.findall(r'data-job-id="(\w+)"', client.get("/ui/jobs?name=run-4").text) == [ids[4]]
    bad = client.get("/ui/jobs?label=nokey")
    assert bad.status_code == 422 and "key=value" in bad.text


def test_a_failure_reason_is_on_the_list_and_the_page(app, client):
    project, keys = make_project(client, "a")
    job = job_in(app, project)
    move_job(app, job, S.STARTING, S.RUNNING)
    move_job(app, job, S.FAILED, reason="app_error", message="ZeroDivisionError: division by zero")
    signed_in(client, keys["viewer"])
    row = client.get("/ui/api/jobs").json()["items"][0]
    assert (row["state"], row["reason"], row["why"]) == ("FAILED", "app_error", "failed")
    page = client.get(f"/ui/jobs/{job}").text
    assert 'class="reason failed' in page and "ZeroDivisionError: division by zero" in page


# --- roles and CSRF on the actions ------------------------------------------------------------------------


def test_a_viewer_sees_no_actions_and_its_posts_are_403(app, client, tmp_path):
    project, keys = make_project(client, "a")
    job = job_in(app, project)
    signed_in(client, keys["viewer"])
    page = client.get(f"/ui/jobs/{job}").text
    assert 'id="cancel-form"' not in page and "deploy-form" not in page
    answer = client.post(f"/ui/jobs/{job}/cancel", data={"csrf_token": csrf(client)}, follow_redirects=False)
    assert answer.status_code == 403 and "read-only" in answer.text
    assert client.get(f"/v1/jobs/{job}", headers=auth(ADMIN)).json()["state"] == "QUEUED"


def test_cancel_needs_the_sessions_csrf_token(app, client):
    project, keys = make_project(client, "a")
    job = job_in(app, project)
    signed_in(client, keys["member"])
    assert 'id="cancel-form"' in client.get(f"/ui/jobs/{job}").text
    assert client.post(f"/ui/jobs/{job}/cancel", follow_redirects=False).status_code == 403
    wrong = client.post(f"/ui/jobs/{job}/cancel", data={"csrf_token": "x" * 43}, follow_redirects=False)
    assert wrong.status_code == 403 and "CSRF" in wrong.text
    assert client.get(f"/v1/jobs/{job}", headers=auth(ADMIN)).json()["state"] == "QUEUED"
    answer = client.post(f"/ui/jobs/{job}/cancel", data={"csrf_token": csrf(client)}, follow_redirects=False)
    assert answer.status_code == 303 and answer.headers["location"] == f"/ui/jobs/{job}"
    assert client.get(f"/v1/jobs/{job}", headers=auth(ADMIN)).json()["state"] == "CANCELLED"
    again = client.post(f"/ui/jobs/{job}/cancel", headers={"X-CSRF-Token": csrf(client)}, follow_redirects=False)
    assert again.status_code == 409 and "already ended" in again.text  # an HTML page with the REST status


def test_a_member_deploys_a_checkpoint_through_the_deployment_service(app, client, tmp_path):
    project, keys = make_project(client, "a")
    job = job_in(app, project, name="Digits run")
    move_job(app, job, S.STARTING, S.RUNNING)
    first, best = add_checkpoint(app, tmp_path, job, 1, 0.80), add_checkpoint(app, tmp_path, job, 2, 0.95)
    signed_in(client, keys["member"])
    page = client.get(f"/ui/jobs/{job}").text
    assert page.count("deploy-form") == 2 and "disabled" in page  # running: not deployable yet
    summary = client.get(f"/ui/api/jobs/{job}").json()
    assert summary["best_checkpoint_id"] == best
    assert [c["best"] for c in summary["checkpoints"]] == [False, True]
    move_job(app, job, S.SUCCEEDED)
    token = csrf(client)
    bad = client.post(f"/ui/jobs/{job}/checkpoints/{best}/deploy", data={"csrf_token": token, "name": "Bad Name"})
    assert bad.status_code == 422 and "lowercase" in bad.text
    answer = client.post(
        f"/ui/jobs/{job}/checkpoints/{first}/deploy",
        data={"csrf_token": token, "name": "digits-first"},
        follow_redirects=False,
    )
    assert answer.status_code == 303 and answer.headers["location"] == "/ui/deployments/digits-first"
    made = client.get("/v1/deployments/digits-first", headers=auth(keys["viewer"])).json()
    assert made["project_id"] == project and made["target"]["checkpoint_id"] == first
    # another job's checkpoint through this job's route: not found
    other = job_in(app, project)
    move_job(app, other, S.STARTING, S.RUNNING, S.SUCCEEDED)
    answer = client.post(f"/ui/jobs/{other}/checkpoints/{best}/deploy", data={"csrf_token": token, "name": "x-y"})
    assert answer.status_code == 404
    assert client.get("/v1/deployments/x-y", headers=auth(ADMIN)).status_code == 404
    # Replicas that could never fit the project's quota (it may not borrow): the REST API's 422 here too.
    quota = {"max_cpus": 0.5, "borrowing": False}
    assert client.put(f"/v1/projects/{project}/quota", json=quota, headers=auth(ADMIN)).status_code == 200
    app.state.service.settings.serve_replica_cpus = 1.0  # the operator's default replica size
    refused = client.post(f"/ui/jobs/{job}/checkpoints/{best}/deploy", data={"csrf_token": token, "name": "big"})
    assert refused.status_code == 422 and "max_cpus" in refused.text


# --- the page: plan, curves, logs -------------------------------------------------------------------------


def test_the_page_shows_the_plan_with_a_memory_estimate(app, client):
    project, keys = make_project(client, "a")
    job = job_in(app, project)
    signed_in(client, keys["viewer"])
    page = client.get(f"/ui/jobs/{job}")
    assert page.status_code == 200 and "Content-Security-Policy" in page.headers
    plan = page.text[page.text.index('id="plan"') :]
    assert "<strong>ddp</strong>" in plan and "Global batch" in plan
    assert re.search(r"[\d.]+(e-\d+)? GB estimated", plan)
    assert "<script>" not in page.text  # no inline script (the CSP forbids it); data as JSON only


def test_curves_are_downsampled_per_series_with_extremes_kept_and_restarts_marked(app, client):
    project, keys = make_project(client, "a")
    job = job_in(app, project)
    move_job(app, job, S.STARTING, S.RUNNING)
    add_metrics(app, job, 1, range(0, 6000), lambda s: {"train_loss": 50.0 if s == 4321 else 1.0, "note": "x"})
    add_metrics(
        app, job, 2, range(5000, 9000), lambda s: {"train_loss": -2.0 if s == 7000 else 0.5, "val_accuracy": 0.9}
    )
    signed_in(client, keys["viewer"])
    data = client.get(f"/ui/api/jobs/{job}/metrics?points=200").json()
    assert data["points"] == 10_000 and data["x_axis"] == "step"
    titles = [c["title"] for c in data["charts"]]
    assert titles == ["loss", "accuracy"]  # "note" is no number: no chart
    loss = data["charts"][0]
    by_attempt = {s["attempt"]: s["y"] for s in loss["series"]}
    assert set(by_attempt) == {1, 2}
    for ys in by_attempt.values():
        assert sum(y is not None for y in ys) <= 200
    assert max(y for y in by_attempt[1] if y is not None) == 50.0
    assert loss["x"][by_attempt[1].index(50.0)] == 4321
    assert min(y for y in by_attempt[2] if y is not None) == -2.0
    assert data["restarts"] == [{"attempt": 2, "x": 5000.0}]
    accuracy = data["charts"][1]["series"]
    assert [(s["metric"], s["attempt"]) for s in accuracy] == [("val_accuracy", 2)]


def test_curves_per_epoch_and_by_time(app, client):
    project, keys = make_project(client, "a")
    job = job_in(app, project)
    add_metrics(app, job, 1, range(30), lambda s: {"train_loss": float(s)})
    signed_in(client, keys["viewer"])
    epochs = client.get(f"/ui/api/jobs/{job}/metrics?x=epoch").json()["charts"][0]
    assert epochs["x"] == [0.0, 1.0, 2.0] and epochs["series"][0]["y"] == [4.5, 14.5, 24.5]  # means
    timed = client.get(f"/ui/api/jobs/{job}/metrics?x=time").json()["charts"][0]
    assert all(math.isfinite(x) and x > 1.7e9 for x in timed["x"])
    assert client.get(f"/ui/api/jobs/{job}/metrics?x=wall").status_code == 422


def test_metrics_polling_answers_304_until_a_point_arrives(app, client):
    project, keys = make_project(client, "a")
    job = job_in(app, project)
    add_metrics(app, job, 1, range(10), lambda s: {"train_loss": 1.0})
    signed_in(client, keys["viewer"])
    url = f"/ui/api/jobs/{job}/metrics"
    first = client.get(url)
    etag = first.headers["etag"]
    again = client.get(url, headers={"If-None-Match": etag})
    assert again.status_code == 304 and again.content == b""
    add_metrics(app, job, 1, [10], lambda s: {"train_loss": 0.5})
    changed = client.get(url, headers={"If-None-Match": etag})
    assert changed.status_code == 200 and changed.headers["etag"] != etag
    summary = client.get(f"/ui/api/jobs/{job}")
    assert client.get(f"/ui/api/jobs/{job}", headers={"If-None-Match": summary.headers["etag"]}).status_code == 304


def test_logs_tail_follow_search_and_download_per_attempt(app, client, backend, monkeypatch):
    project, keys = make_project(client, "a")
    job = job_in(app, project)
    move_job(app, job, S.STARTING, S.RUNNING, S.RESTARTING, S.RUNNING)
    outputs = {
        f"{job}-1": "".join(f"first attempt line {i}\n" for i in range(3000)),
        f"{job}-2": "\x1b[32mcolour\x1b[0m line\nepoch 1/2 step 10: train_loss 0.5\nLoss spike\n",
    }
    monkeypatch.setattr(backend, "logs", lambda submission_id: outputs.get(submission_id))
    signed_in(client, keys["viewer"])
    current = client.get(f"/ui/api/jobs/{job}/logs").json()
    assert current["attempt"] == 2 and [t for _, t in current["lines"]] == [
        "colour line",
        "epoch 1/2 step 10: train_loss 0.5",
        "Loss spike",
    ]
    tail = client.get(f"/ui/api/jobs/{job}/logs?attempt=1&tail=5").json()
    assert tail["total"] == 3000 and tail["start"] == 2995 and tail["lines"][-1] == [2999, "first attempt line 2999"]
    outputs[f"{job}-1"] += "a new line\n"  # a follow asks for what comes after the last line it has
    follow = client.get(f"/ui/api/jobs/{job}/logs?attempt=1&after=3000").json()
    assert follow["lines"] == [[3000, "a new line"]] and follow["next"] == 3001
    outputs[f"{job}-1"] = "a shorter copy\n"  # e.g. Ray lost its live copy; the archive holds less
    restarted = client.get(f"/ui/api/jobs/{job}/logs?attempt=1&after=3001").json()
    assert restarted["reset"] is True and restarted["lines"] == [[0, "a shorter copy"]] and restarted["next"] == 1
    outputs[f"{job}-1"] += "".join(f"first attempt line {i}\n" for i in range(2999)) + "a new line\n"
    found = client.get(f"/ui/api/jobs/{job}/logs?attempt=2&q=LOSS").json()
    assert found["matches"] == 2 and [n for n, _ in found["lines"]] == [1, 2]
    download = client.get(f"/ui/jobs/{job}/logs/download?attempt=1")
    assert download.status_code == 200 and download.text.count("\n") == 3001  # whole, no tail
    assert download.headers["content-disposition"] == f'attachment; filename="{job}-attempt-1.log"'
    assert client.get(f"/ui/api/jobs/{job}/logs?attempt=3").status_code == 404


def test_the_page_of_a_job_with_restarts_shows_every_event(app, client):
    project, keys = make_project(client, "a")
    job = job_in(app, project)
    move_job(app, job, S.STARTING, S.RUNNING)
    move_job(app, job, S.RESTARTING, reason="worker_died", message="rank 1 was killed")
    move_job(app, job, S.RUNNING)
    signed_in(client, keys["viewer"])
    events = client.get(f"/ui/api/jobs/{job}").json()["events"]
    assert [e["to_state"] for e in events] == ["QUEUED", "STARTING", "RUNNING", "RESTARTING", "RUNNING"]
    page = client.get(f"/ui/jobs/{job}").text
    timeline = page[page.index('id="timeline"') : page.index("</ol>", page.index('id="timeline"'))]
    assert timeline.count("<li>") == 5 and "worker_died" in timeline and "rank 1 was killed" in timeline
    assert '<option value="2">2</option>' in page  # the logs of both attempts
    goodput = page[page.index('id="goodput"') : page.index("</dd>", page.index('id="goodput"'))]
    assert "%</strong>" in goodput and "lost:" in goodput and "restarts" in goodput, goodput


def test_the_page_names_the_stragglers_of_the_attempt(app, client):
    from orchestrator.states.jobs import lock_job, record_straggler

    project, keys = make_project(client, "a")
    job = job_in(app, project)
    move_job(app, job, S.STARTING, S.RUNNING)
    signed_in(client, keys["viewer"])
    assert 'id="stragglers"' not in client.get(f"/ui/jobs/{job}").text
    with app.state.service.sessions.begin() as session:
        row = lock_job(session, job)
        record_straggler(session, row, {"rank": 1, "ratio": 3.1, "step": 60}, "rank 1 is a straggler")
    page = client.get(f"/ui/jobs/{job}").text
    stragglers = page[page.index('id="stragglers"') : page.index("</dd>", page.index('id="stragglers"'))]
    assert "rank 1: 3.1x from step 60" in stragglers, stragglers
    assert client.get(f"/ui/api/jobs/{job}").json()["job"]["stragglers"][0]["rank"] == 1


def test_static_files_and_the_vendored_chart_library_are_served(client):
    for path in ("/ui/static/app.js", "/ui/static/live.js", "/ui/static/charts.js", "/ui/static/job.js"):
        assert client.get(path).status_code == 200
    vendored = client.get("/ui/static/vendor/uPlot.iife.min.js")
    assert vendored.status_code == 200 and "uPlot" in vendored.text
    assert client.get("/ui/static/vendor/uPlot.min.css").status_code == 200
    # the vendored copy is the version scripts/vendor-ui.sh pins (it checks that tarball's sha512)
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    pinned = re.search(r"^VERSION=(\S+)$", (root / "scripts/vendor-ui.sh").read_text(), re.M).group(1)
    assert f"(v{pinned})" in vendored.text[:200]
    assert "MIT License" in (root / "api/ui/static/vendor/uPlot.LICENSE").read_text()


def test_the_ui_is_not_part_of_the_rest_contract(app):
    assert not [path for path in app.openapi()["paths"] if path.startswith("/ui")]


def test_a_second_user_keeps_its_own_session(app, client):
    _project, keys = make_project(client, "a")
    other = TestClient(app)
    signed_in(client, keys["member"])
    signed_in(other, keys["viewer"])
    assert "role-member" in client.get("/ui/jobs").text and "role-viewer" in other.get("/ui/jobs").text
