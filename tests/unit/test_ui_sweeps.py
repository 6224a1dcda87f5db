"""The dashboard's sweep pages (/ui/sweeps, /ui/sweeps/{id}) and their JSON (/ui/api/sweeps...): the trial
table, the curves, the best trial's deploy button (members, CSRF), and project isolation on every route."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

from orchestrator.db.models import JobState, Trial, TrialMetric, TrialState
from orchestrator.repositories import sweeps as sweeps_repo
from orchestrator_contract.sweeps import SweepSpec
from tests.unit.api_helpers import ADMIN, auth, make_project
from tests.unit.ui_helpers import csrf, signed_in

BASE = {"workload": "digits", "epochs": 3, "scaling": {"num_workers": 1, "cpus_per_worker": 0.5}}
SPACE = {
    "lr.base": {"type": "loguniform", "low": 1e-3, "high": 0.3},
    "config.hidden": {"type": "choice", "values": [16, 32]},
}
# (config, state, val_loss per epoch, stopped early); val_loss is minimised: trial 2 is the best
TRIALS = [
    ({"lr.base": 0.1, "config.hidden": 16}, TrialState.SUCCEEDED, [0.9, 0.6, 0.5], False),
    ({"lr.base": 0.01, "config.hidden": 32}, TrialState.SUCCEEDED, [0.8, 0.4, 0.2], False),
    ({"lr.base": 0.2, "config.hidden": 16}, TrialState.STOPPED, [1.5], True),
    ({"lr.base": 0.003, "config.hidden": 32}, TrialState.FAILED, [], False),
]


@pytest.fixture
def settings_overrides() -> dict:
    return {"workload_packages": ""}


def make_sweep(app, tmp_path, project_id: str, name: str = "search", state: JobState = JobState.SUCCEEDED) -> dict:
    """A sweep of ``project_id`` with the trials of ``TRIALS``, their per-epoch metrics and checkpoint folders
    (each holding a model.pt); returns its id and its trials' ids by number."""
    spec = SweepSpec.model_validate(
        {"name": name, "base": BASE, "search_space": SPACE, "metric": "val_loss", "num_samples": 4}
    )
    with app.state.service.sessions.begin() as session:
        sweep = sweeps_repo.create_sweep(session, project_id, spec)
        sweep.state = state
        trials = {}
        for index, (config, trial_state, losses, early) in enumerate(TRIALS):
            trial = sweeps_repo.add_trial(session, sweep.id, f"{sweep.id}_{index:05d}", config)
            for epoch, loss in enumerate(losses, start=1):
                folder = tmp_path / sweep.id / trial.id / f"checkpoint_{epoch}"
                folder.mkdir(parents=True)
                (folder / "model.pt").write_bytes(b"weights")
                values = {"val_loss": loss, "val_accuracy": 1 - loss / 2}
                sweeps_repo.record_trial_metric(session, trial, epoch, 10 * epoch, values, str(folder))
                trial.latest_metrics = {**values, "epoch": epoch}  # as the driver's events set it
            if losses:
                best = min(range(len(losses)), key=lambda i: losses[i])
                trial.best_metric, trial.best_epoch = losses[best], best + 1
                trial.checkpoint_path = str(tmp_path / sweep.id / trial.id / f"checkpoint_{best + 1}")
            trial.state, trial.iterations, trial.stopped_early = trial_state, len(losses), early
            trial.message = "stopped by the scheduler after 1 of 3 epochs" if early else ""
            if trial_state == TrialState.FAILED:
                trial.reason, trial.message = "app_error", "ValueError: boom"
            trials[trial.number] = trial.id
        session.flush()
        sweep.best_trial_id = trials[2]
        return {"id": sweep.id, "trials": trials}


@pytest.fixture
def two_projects(app, client, tmp_path):
    """Projects a and b, each with a sweep; a's also with a second, running one."""
    a, a_keys = make_project(client, "a")
    b, b_keys = make_project(client, "b")
    return {
        "a": {"id": a, "keys": a_keys, "sweep": make_sweep(app, tmp_path, a, "search-a")},
        "a_running": make_sweep(app, tmp_path / "r", a, "other-a", JobState.RUNNING),
        "b": {"id": b, "keys": b_keys, "sweep": make_sweep(app, tmp_path / "b", b, "search-b")},
    }


def user(app, key: str) -> TestClient:
    return signed_in(TestClient(app), key)


def test_the_sweep_page_shows_the_trials_the_curves_and_the_best_trial(app, two_projects):
    sweep = two_projects["a"]["sweep"]
    member = user(app, two_projects["a"]["keys"]["member"])
    page = member.get(f"/ui/sweeps/{sweep['id']}")
    assert page.status_code == 200, page.text
    html = page.text
    for trial_id in sweep["trials"].values():
        assert f'data-trial-id="{trial_id}"' in html
    assert html.count('data-testid="stopped-early"') == 1  # trial 3, stopped by ASHA
    assert f'<tr data-trial-id="{sweep["trials"][2]}" class="best">' in html
    assert 'id="deploy-best"' in html and f'value="{sweep["trials"][2]}"' in html
    assert "ValueError: boom" in html and 'id="sweep-chart"' in html and 'id="parallel"' in html
    assert "/ui/static/charts.js" in html and "/ui/static/sweep.js" in html
    assert '"pending": true' in html  # the page reads no points: its first poll brings the curves

    data = member.get(f"/ui/api/sweeps/{sweep['id']}")
    assert data.status_code == 200
    body = data.json()
    assert body["sweep"]["best_trial"]["id"] == sweep["trials"][2] and body["sweep"]["best_number"] == 2
    assert body["sweep"]["best_deployable"] is True
    assert [p["path"] for p in body["params"]] == ["config.hidden", "lr.base"]
    assert [p["log"] for p in body["params"]] == [False, True]
    by_number = {t["number"]: t for t in body["trials"]}
    assert by_number[3]["stopped_early"] and by_number[3]["state"] == "STOPPED"
    assert by_number[4]["deployable"] is False  # no metric, no checkpoint
    # Every trial that reported the metric has a curve, on one shared x (epochs), with gaps where it has none.
    curves = body["curves"]
    assert curves["x"] == [1.0, 2.0, 3.0]
    assert [s["label"] for s in curves["series"]] == ["trial 1", "trial 2", "trial 3"]
    assert curves["series"][1]["y"] == [0.8, 0.4, 0.2]
    assert curves["series"][2]["y"] == [1.5, None, None]
    assert (curves["metric"], curves["metrics"]) == ("val_loss", ["val_accuracy", "val_loss"])
    # Another metric the trials reported, on request (the page's metric picker).
    accuracy = member.get(f"/ui/api/sweeps/{sweep['id']}", params={"metric": "val_accuracy"}).json()["curves"]
    assert accuracy["metric"] == "val_accuracy" and accuracy["series"][1]["y"] == [0.6, 0.8, 0.9]
    assert member.get(f"/ui/api/sweeps/{sweep['id']}", params={"metric": "nope"}).json()["curves"]["series"] == []
    # Live: the same answer again is a 304; a new point changes the ETag.
    etag = data.headers["ETag"]
    assert member.get(f"/ui/api/sweeps/{sweep['id']}", headers={"If-None-Match": etag}).status_code == 304
    with app.state.service.sessions.begin() as session:
        trial = session.get(Trial, sweep["trials"][3])
        sweeps_repo.record_trial_metric(session, trial, 2, 20, {"val_loss": 1.2})
    again = member.get(f"/ui/api/sweeps/{sweep['id']}", headers={"If-None-Match": etag})
    assert again.status_code == 200 and again.json()["curves"]["series"][2]["y"] == [1.5, 1.2, None]


def test_a_trials_curve_is_downsampled_keeping_its_extremes(app, client, tmp_path):
    project, keys = make_project(client, "a")
    sweep = make_sweep(app, tmp_path, project)
    with app.state.service.sessions.begin() as session:
        trial = session.get(Trial, sweep["trials"][1])
        session.add_all(
            TrialMetric(trial_id=trial.id, epoch=epoch, step=epoch, values={"val_loss": 50.0 if epoch == 1234 else 0.5})
            for epoch in range(4, 3001)
        )
    body = user(app, keys["viewer"]).get(f"/ui/api/sweeps/{sweep['id']}").json()
    series = body["curves"]["series"][0]
    points = [v for v in series["y"] if v is not None]
    assert len(points) <= 500 and 50.0 in points and points[0] == 0.9  # the spike and the first point survive


def test_the_list_pages_filters_in_the_url_and_its_json(app, two_projects):
    member = user(app, two_projects["a"]["keys"]["member"])
    a, running = two_projects["a"]["sweep"]["id"], two_projects["a_running"]["id"]
    page = member.get("/ui/sweeps")
    assert page.status_code == 200
    assert f'data-sweep-id="{a}"' in page.text and f'data-sweep-id="{running}"' in page.text
    only_running = member.get("/ui/sweeps?state=RUNNING")
    assert f'data-sweep-id="{running}"' in only_running.text and f'data-sweep-id="{a}"' not in only_running.text
    assert 'value="RUNNING" checked' in only_running.text  # the filter stays on the form
    assert "/ui/api/sweeps?state=RUNNING" in only_running.text  # and on the live URL
    by_name = member.get("/ui/api/sweeps?name=search")
    assert [s["id"] for s in by_name.json()["items"]] == [a]
    first = member.get("/ui/api/sweeps?limit=1").json()
    assert len(first["items"]) == 1 and first["next_cursor"]
    second = member.get("/ui/api/sweeps", params={"limit": 1, "cursor": first["next_cursor"]}).json()
    assert len(second["items"]) == 1 and second["items"][0]["id"] != first["items"][0]["id"]
    assert second["next_cursor"] is None
    assert 'id="next-page"' not in member.get("/ui/sweeps?limit=25").text
    assert member.get("/ui/api/sweeps?state=NOPE").status_code == 422


def test_a_member_deploys_the_best_trial_with_the_csrf_token(app, two_projects):
    sweep = two_projects["a"]["sweep"]
    member = user(app, two_projects["a"]["keys"]["member"])
    token = csrf(member, f"/ui/sweeps/{sweep['id']}")
    form = {"name": "best-of-a", "trial_id": sweep["trials"][2]}
    without = member.post(f"/ui/sweeps/{sweep['id']}/deploy", data=form, follow_redirects=False)
    assert without.status_code == 403 and "CSRF" in without.text
    wrong = member.post(
        f"/ui/sweeps/{sweep['id']}/deploy", data={**form, "csrf_token": "x" * 20}, follow_redirects=False
    )
    assert wrong.status_code == 403
    bad_name = member.post(
        f"/ui/sweeps/{sweep['id']}/deploy",
        data={**form, "name": "Bad Name", "csrf_token": token},
        follow_redirects=False,
    )
    assert bad_name.status_code == 422 and "lowercase" in bad_name.text
    assert app.state.client.get("/v1/deployments", headers=auth(ADMIN)).json() == []
    done = member.post(f"/ui/sweeps/{sweep['id']}/deploy", data={**form, "csrf_token": token}, follow_redirects=False)
    assert done.status_code == 303 and done.headers["location"] == "/ui/deployments/best-of-a"
    deployment = app.state.client.get("/v1/deployments/best-of-a", headers=auth(ADMIN)).json()
    assert deployment["project_id"] == two_projects["a"]["id"]
    assert deployment["target"]["source"] == {"trial_id": sweep["trials"][2], "select": "best"}
    assert deployment["target"]["checkpoint"]["trial_id"] == sweep["trials"][2]
    assert deployment["target"]["checkpoint"]["epoch"] == 3  # the trial's best epoch (val_loss 0.2)
    assert (
        deployment["message"] == f"deploying version 1 from trial {sweep['trials'][2]} of sweep {sweep['id']} (epoch 3)"
    )
    # Its page names where the checkpoint came from: the trial, linked to its sweep.
    page = member.get("/ui/deployments/best-of-a").text
    assert f'<a href="/ui/sweeps/{sweep["id"]}">trial {sweep["trials"][2]}</a>' in page
    # A trial of another sweep, through this sweep's route: not found.
    other = two_projects["a_running"]["trials"][1]
    stray = member.post(
        f"/ui/sweeps/{sweep['id']}/deploy", data={"name": "stray", "trial_id": other, "csrf_token": token}
    )
    assert stray.status_code == 404


def test_a_viewer_sees_no_deploy_button_and_is_refused(app, two_projects):
    sweep = two_projects["a"]["sweep"]
    viewer = user(app, two_projects["a"]["keys"]["viewer"])
    page = viewer.get(f"/ui/sweeps/{sweep['id']}")
    assert page.status_code == 200 and 'id="deploy-best"' not in page.text and 'id="deploy-form"' not in page.text
    token = csrf(viewer, f"/ui/sweeps/{sweep['id']}")
    refused = viewer.post(
        f"/ui/sweeps/{sweep['id']}/deploy",
        data={"name": "by-viewer", "trial_id": sweep["trials"][2], "csrf_token": token},
        follow_redirects=False,
    )
    assert refused.status_code == 403 and "read-only" in refused.text
    assert app.state.client.get("/v1/deployments", headers=auth(ADMIN)).json() == []


def test_another_projects_sweeps_are_not_found_anywhere(app, two_projects):
    b_sweep = two_projects["b"]["sweep"]
    for role in ("member", "viewer"):
        a_user = user(app, two_projects["a"]["keys"][role])
        assert b_sweep["id"] not in a_user.get("/ui/sweeps").text
        assert b_sweep["id"] not in a_user.get("/ui/sweeps?name=search-b").text
        assert a_user.get("/ui/api/sweeps?name=search-b").json()["items"] == []
        assert all(s["project_id"] == two_projects["a"]["id"] for s in a_user.get("/ui/api/sweeps").json()["items"])
        page = a_user.get(f"/ui/sweeps/{b_sweep['id']}")
        assert page.status_code == 404 and "search-b" not in page.text
        assert a_user.get(f"/ui/api/sweeps/{b_sweep['id']}").status_code == 404
        token = csrf(a_user, "/ui/sweeps")
        deploy = a_user.post(
            f"/ui/sweeps/{b_sweep['id']}/deploy",
            data={"name": "stolen", "trial_id": b_sweep["trials"][2], "csrf_token": token},
        )
        assert deploy.status_code == 404 if role == "member" else deploy.status_code == 403
    assert app.state.client.get("/v1/deployments", headers=auth(ADMIN)).json() == []
    # The cluster-wide admin sees every project's sweeps.
    admin = user(app, ADMIN)
    listed = admin.get("/ui/sweeps").text
    assert b_sweep["id"] in listed and two_projects["a"]["sweep"]["id"] in listed
    assert admin.get(f"/ui/api/sweeps/{b_sweep['id']}").status_code == 200


def test_without_a_session_the_pages_redirect_and_the_json_is_401(app, client, tmp_path):
    project, _ = make_project(client, "a")
    sweep = make_sweep(app, tmp_path, project)
    anonymous = TestClient(app)
    for path in ("/ui/sweeps", f"/ui/sweeps/{sweep['id']}"):
        answer = anonymous.get(path, follow_redirects=False)
        assert answer.status_code == 303 and answer.headers["location"].startswith("/ui/login?next=")
    for path in ("/ui/api/sweeps", f"/ui/api/sweeps/{sweep['id']}"):
        assert anonymous.get(path).status_code == 401
    deploy = anonymous.post(
        f"/ui/sweeps/{sweep['id']}/deploy", data={"name": "x", "trial_id": "y"}, follow_redirects=False
    )
    assert deploy.status_code == 303


def test_a_trial_still_running_cannot_be_deployed_and_the_button_says_so(app, client, tmp_path):
    project, keys = make_project(client, "a")
    sweep = make_sweep(app, tmp_path, project, state=JobState.RUNNING)
    with app.state.service.sessions.begin() as session:
        session.get(Trial, sweep["trials"][2]).state = TrialState.RUNNING
    member = user(app, keys["member"])
    page = member.get(f"/ui/sweeps/{sweep['id']}")
    assert re.search(r'id="deploy-best"\s+disabled', page.text)
    token = csrf(member, f"/ui/sweeps/{sweep['id']}")
    answer = member.post(
        f"/ui/sweeps/{sweep['id']}/deploy", data={"name": "early", "trial_id": sweep["trials"][2], "csrf_token": token}
    )
    assert answer.status_code == 422 and "is RUNNING" in answer.text


def test_a_sweep_without_trials_yet_renders_with_nothing_to_deploy(app, client):
    _project, keys = make_project(client, "a")
    spec = {"name": "fresh", "base": BASE, "search_space": SPACE, "metric": "val_loss"}
    made = client.post("/v1/sweeps", json=spec, headers=auth(keys["member"]))
    assert made.status_code == 201, made.text
    member = user(app, keys["member"])
    page = member.get(f"/ui/sweeps/{made.json()['id']}")
    assert page.status_code == 200 and "QUEUED" in page.text and "No trials yet." in page.text
    assert 'id="deploy-form" class="hidden"' in page.text and 'id="best-none" class="muted "' in page.text
    data = member.get(f"/ui/api/sweeps/{made.json()['id']}").json()
    assert data["trials"] == [] and data["curves"]["series"] == [] and data["sweep"]["best_trial"] is None
    assert data["sweep"]["best_deployable"] is False and data["trials_total"] == 0


def test_a_member_cancels_a_sweep_from_its_page_and_a_viewer_cannot(app, client):
    _project, keys = make_project(client, "a")
    _other, other_keys = make_project(client, "b")
    spec = {"name": "to-cancel", "base": BASE, "search_space": SPACE, "metric": "val_loss"}
    queued = client.post("/v1/sweeps", json=spec, headers=auth(keys["member"])).json()
    path = f"/ui/sweeps/{queued['id']}"
    viewer, member, stranger = user(app, keys["viewer"]), user(app, keys["member"]), user(app, other_keys["member"])
    assert 'id="cancel-sweep"' not in viewer.get(path).text
    refused = viewer.post(f"{path}/cancel", data={"csrf_token": csrf(viewer, path)}, follow_redirects=False)
    assert refused.status_code == 403
    assert member.post(f"{path}/cancel", follow_redirects=False).status_code == 403  # no CSRF token
    stolen = stranger.post(f"{path}/cancel", data={"csrf_token": csrf(stranger, "/ui/sweeps")})
    assert stolen.status_code == 404
    assert client.get(f"/v1/sweeps/{queued['id']}", headers=auth(ADMIN)).json()["state"] == "QUEUED"
    page = member.get(path)
    assert 'id="cancel-sweep"' in page.text and 'id="sweep-cancel-form" data-confirm' in page.text
    done = member.post(f"{path}/cancel", data={"csrf_token": csrf(member, path)}, follow_redirects=False)
    assert done.status_code == 303 and done.headers["location"] == path
    assert client.get(f"/v1/sweeps/{queued['id']}", headers=auth(ADMIN)).json()["state"] == "CANCELLED"
    assert member.get(f"/ui/api/sweeps/{queued['id']}").json()["sweep"]["terminal"] is True
    again = member.post(f"{path}/cancel", data={"csrf_token": csrf(member, path)})
    assert again.status_code == 409 and "already ended CANCELLED" in again.text
