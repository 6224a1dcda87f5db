"""The dashboard (/ui) in a real headless Chromium, over the session's real service and Ray cluster.

Debian's ``chromium`` (scripts/ensure-chromium.sh installs it; ``make install`` and ``make test`` run it) is
driven through Playwright with ``executable_path``: Playwright's own browser download is never used. Where no
Chromium can be found, every test here is skipped with a message that says so, except under CI (CI=true), where
each fails with that message; anything else that goes wrong fails. One browser for the module; each key signs
in in a context of its own (its own cookies).

Screenshots of every page go to ``test-output/screenshots/`` at the repository root (gitignored; the path is
printed), so a failed run leaves what the browser saw.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, BrowserContext, Page, expect, sync_playwright

from tests.integration.conftest import Api, remove_serving

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "test-output" / "screenshots"
VIEWPORT = {"width": 1000, "height": 720}
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def chromium_path() -> str | None:
    """ORCHESTRATOR_CHROMIUM if set, else the first Chromium on PATH (Debian's is /usr/bin/chromium)."""
    explicit = os.environ.get("ORCHESTRATOR_CHROMIUM")
    if explicit:
        return explicit if Path(explicit).is_file() else None
    return next((path for name in CHROMIUM_NAMES if (path := shutil.which(name))), None)


CHROMIUM = chromium_path()
IN_CI = os.environ.get("CI", "").strip().lower() in ("true", "1")  # as scripts/ensure-chromium.sh reads it
NO_CHROMIUM = (
    "no Chromium found (looked for ORCHESTRATOR_CHROMIUM, then "
    f"{', '.join(CHROMIUM_NAMES)} on PATH): run `bash scripts/ensure-chromium.sh` "
    "(apt-get install chromium, as root) to run the dashboard's browser tests"
)
# Decided before any fixture runs, so a developer's machine without Chromium does not start Ray for these tests.
# Under CI they are not skipped: chromium_under_ci fails them instead.
pytestmark = [pytest.mark.integration, pytest.mark.skipif(CHROMIUM is None and not IN_CI, reason=NO_CHROMIUM)]


@pytest.fixture(scope="session", autouse=True)
def chromium_under_ci() -> None:
    """Under CI (CI=true) a missing Chromium fails every test here, where a developer gets a skip: a CI run must
    not pass with the dashboard untested. Session-scoped and autouse, so it is set up before the Ray cluster."""
    if CHROMIUM is None:
        pytest.fail(f"CI=true: {NO_CHROMIUM}", pytrace=False)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    path = CHROMIUM
    assert path is not None
    SHOTS.mkdir(parents=True, exist_ok=True)
    print(f"\nbrowser tests: {path}; screenshots in {SHOTS}")
    with sync_playwright() as playwright:
        # --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start.
        browser = playwright.chromium.launch(executable_path=path, headless=True, args=["--no-sandbox"])
        try:
            yield browser
        finally:
            browser.close()


def shot(page: Page, name: str) -> Path:
    """A screenshot of the page as it is now, as test-output/screenshots/<name>.png."""
    path = SHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def readme_shot(page: Page, selector: str, name: str) -> Path:
    """The README's pictures (docs/img/, after pngquant): the viewport's width, 720 px down from ``selector``."""
    box = page.locator(selector).bounding_box()
    assert box is not None, selector
    path = SHOTS / f"{name}.png"
    clip = {"x": 0, "y": max(box["y"] - 12, 0), "width": VIEWPORT["width"], "height": VIEWPORT["height"]}
    page.screenshot(path=str(path), clip=clip, full_page=True)
    return path


def wait_for(what: str, check: Callable[[], object], timeout_s: float = 60, every_s: float = 0.5):
    """Poll ``check`` until it returns something truthy; fail saying ``what`` was awaited."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not after {timeout_s:.0f} s")
        time.sleep(every_s)


class Signed:
    """One signed-in browser user: its context (cookies), a page, and the REST client of the same key."""

    def __init__(self, context: BrowserContext, page: Page, api: Api, base_url: str):
        self.context = context
        self.page = page
        self.api = api
        self.base_url = base_url

    def goto(self, path: str) -> Page:
        response = self.page.goto(self.base_url + path)
        assert response is not None and response.ok, (path, response and response.status)
        return self.page


def sign_in(browser: Browser, base_url: str, key: str) -> Signed:
    """A new context, the sign-in form filled with ``key``: lands on the jobs list."""
    context = browser.new_context(viewport=VIEWPORT, base_url=base_url)
    context.set_default_timeout(30_000)
    page = context.new_page()
    page.goto(f"{base_url}/ui/login")
    page.fill("input[name=api_key]", key)
    page.click("button[type=submit]")
    page.wait_for_url("**/ui/jobs**")
    return Signed(context, page, Api(base_url, key), base_url)


def new_key(admin: Api, member: Api, role: str) -> str:
    """A key of ``role`` in the member's project."""
    project_id = member.http.get("/v1/whoami").json()["project_id"]
    response = admin.http.post(f"/v1/projects/{project_id}/keys", json={"role": role, "name": f"ui-{role}"})
    assert response.status_code == 201, response.text
    return response.json()["key"]


@pytest.fixture(scope="module")
def member_ui(browser, service, member) -> Iterator[Signed]:
    key = member.http.headers["Authorization"].removeprefix("Bearer ")
    user = sign_in(browser, service, key)
    yield user
    user.context.close()


# --- signing in --------------------------------------------------------------------------------------------


def test_sign_in_with_a_key_and_a_wrong_key_is_told_why(browser, service, member_ui):
    context = browser.new_context(viewport=VIEWPORT)
    try:
        page = context.new_page()
        page.goto(f"{service}/ui/jobs")  # no session: to the sign-in page, which remembers where to go
        expect(page.locator("input[name=api_key]")).to_be_visible()
        shot(page, "00-sign-in")
        page.fill("input[name=api_key]", "not-a-key")
        page.click("button[type=submit]")
        expect(page.locator("[role=alert]")).to_contain_text("Not signed in")
        assert "/ui/login" in page.url
    finally:
        context.close()
    # The member's own sign-in (the fixture) landed on the jobs list with a session cookie that scripts cannot read.
    page = member_ui.goto("/ui/jobs")
    expect(page.locator("table#jobs")).to_be_visible()
    [cookie] = [c for c in member_ui.context.cookies() if c["name"] == "orch_ui"]
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == "/ui"
    assert page.evaluate("document.cookie") == ""
    shot(page, "01-jobs")


# --- a running job: its curve grows, its logs follow, a viewer cannot cancel it, a member can -----------------


def chart_counts(page: Page, selector: str) -> tuple[int, int]:
    """(x values, series) the chart at ``selector`` holds now: charts.js writes them on the chart's element
    (``data-points``, ``data-series``) at every update; (0, 0) before the first."""
    counts = page.eval_on_selector(selector, "el => [Number(el.dataset.points || 0), Number(el.dataset.series || 0)]")
    return counts[0], counts[1]


def log_lines(page: Page) -> int:
    """The log lines the page shows (innerText: one line per rendered line element)."""
    return page.eval_on_selector("#logs", "el => el.innerText.split('\\n').filter((l) => l.trim()).length")


@pytest.fixture(scope="module")
def running_job(member) -> Iterator[str]:
    """A digits job long enough to be watched (400 epochs, one worker, step metrics every 2 steps), RUNNING;
    cancelled at the end whatever happened."""
    response = member.submit(
        name="ui-live", epochs=400, scaling={"num_workers": 1, "cpus_per_worker": 1}, metrics_every_steps=2
    )
    assert response.status_code == 201, response.text
    job_id = response.json()["id"]
    member.wait(job_id, {"RUNNING"}, timeout_s=180)
    yield job_id
    if member.job(job_id)["state"] not in {"SUCCEEDED", "FAILED", "CANCELLED"}:
        member.http.post(f"/v1/jobs/{job_id}/cancel")
        member.wait(job_id, {"CANCELLED"}, timeout_s=90)


def test_a_running_jobs_curve_grows_and_its_logs_follow_without_a_reload(member_ui, running_job):
    page = member_ui.goto(f"/ui/jobs/{running_job}")
    expect(page.locator("#job-state")).to_have_text("RUNNING")
    page.evaluate("window.__sameDocument = true")  # gone if anything reloads the page
    loss = "#charts [data-chart*=loss]"
    page.wait_for_selector(loss)
    first, _ = wait_for(
        "a loss curve with points", lambda: chart_counts(page, loss)[0] >= 2 and chart_counts(page, loss)
    )
    shot(page, "02-job-running")
    grown = wait_for(
        f"the loss curve growing past {first} points",
        lambda: chart_counts(page, loss)[0] > first and chart_counts(page, loss),
    )
    shot(page, "03-job-running-later")
    readme_shot(page, "#curves", "readme-job")
    assert grown[0] > first
    assert page.evaluate("window.__sameDocument === true"), "the page was reloaded"

    # Logs: followed live, new lines appear while the job runs.
    expect(page.locator("#log-follow")).to_be_checked()
    lines = wait_for("log lines", lambda: log_lines(page))
    more = wait_for(f"more than {lines} log lines", lambda: log_lines(page) > lines and log_lines(page))
    assert more > lines
    # The search box keeps only the lines that have the text.
    page.fill("#log-search", "val_accuracy")
    shown = wait_for(
        "only searched lines shown",
        lambda: (
            (texts := page.eval_on_selector_all("#logs > div", "els => els.map((e) => e.textContent)"))
            and all("val_accuracy" in t for t in texts)
            and texts
        ),
    )
    assert len(shown) < more, (len(shown), more)
    assert page.evaluate("window.__sameDocument === true"), "the page was reloaded"


def test_a_viewer_sees_no_cancel_button_and_a_forced_cancel_is_refused(
    browser, service, admin, member, member_ui, running_job
):
    viewer = sign_in(browser, service, new_key(admin, member, "viewer"))
    try:
        page = viewer.goto(f"/ui/jobs/{running_job}")
        expect(page.locator("#job-state")).to_have_text("RUNNING")
        expect(page.locator("#cancel-button")).to_have_count(0)
        expect(page.locator("#cancel-form")).to_have_count(0)
        shot(page, "04-job-viewer")
        # Forced: the cancel form's POST with the viewer's own session and a valid CSRF token is refused, and so
        # is the REST API's cancel with the viewer's key.
        token = page.get_attribute("meta[name=csrf-token]", "content")
        assert token
        forced = viewer.context.request.post(
            f"{service}/ui/jobs/{running_job}/cancel", form={"csrf_token": token}, max_redirects=0
        )
        assert forced.status == 403, (forced.status, forced.text()[:300])
        assert viewer.api.http.post(f"/v1/jobs/{running_job}/cancel").status_code == 403
    finally:
        viewer.context.close()
    # A member's session without the CSRF token is refused too.
    no_token = member_ui.context.request.post(f"{service}/ui/jobs/{running_job}/cancel", form={}, max_redirects=0)
    assert no_token.status == 403, (no_token.status, no_token.text()[:300])
    assert member.job(running_job)["state"] == "RUNNING"


def test_a_member_cancels_the_job_from_its_page(member_ui, member, running_job):
    page = member_ui.goto(f"/ui/jobs/{running_job}")
    expect(page.locator("#job-state")).to_have_text("RUNNING")
    page.once("dialog", lambda dialog: dialog.accept())  # the form's data-confirm
    page.click("#cancel-button")
    job = member.wait(running_job, {"CANCELLED"}, timeout_s=90)
    assert [e["to_state"] for e in member.http.get(f"/v1/jobs/{running_job}/events").json()][-2:] == [
        "CANCELLING",
        "CANCELLED",
    ], job
    expect(page.locator("#job-state")).to_have_text("CANCELLED", timeout=30_000)
    expect(page.locator("#cancel-form")).to_be_hidden()
    shot(page, "05-job-cancelled")


# --- a sweep: every trial's curve, the best trial deployed, rolled back -------------------------------------

DEPLOYMENT = "ui-best"
LRS = [0.3, 0.003]


@pytest.fixture(scope="module")
def finished_sweep(member) -> dict:
    """A grid sweep of two 1-worker digits trials (2 epochs each, side by side), finished."""
    from tests.integration.test_sweeps_on_ray import SEARCH_TRIAL_SCALING, _base, _submit, _wait

    sweep = _submit(
        member,
        name="ui-sweep",
        base=_base(epochs=2, scaling=SEARCH_TRIAL_SCALING),
        search_space={"lr.base": {"type": "grid", "values": LRS}},
        algorithm="grid",
        metric="val_accuracy",
        max_concurrent_trials=2,
    )
    return _wait(member, sweep["id"], timeout_s=300)


@pytest.fixture(scope="module")
def serving_cleanup(member, ray_cluster) -> Iterator[None]:
    yield
    remove_serving(member, ray_cluster, DEPLOYMENT)


def test_a_sweep_shows_every_trials_curve_and_its_best_trial_deploys_and_rolls_back(
    member_ui, member, finished_sweep, serving_cleanup
):
    sweep = finished_sweep
    trials = member.http.get(f"/v1/sweeps/{sweep['id']}/trials").json()
    assert len(trials) == len(LRS) and all(t["iterations"] == 2 for t in trials), trials

    page = member_ui.goto(f"/ui/sweeps/{sweep['id']}")
    expect(page.locator("#sweep-state")).to_have_text("SUCCEEDED")
    expect(page.locator("table#trials tbody tr[data-trial-id]")).to_have_count(len(LRS))
    # One curve per trial on one chart, each with a point per epoch.
    points, series = wait_for(
        "every trial's curve",
        lambda: chart_counts(page, "#sweep-chart")[1] == len(LRS) and chart_counts(page, "#sweep-chart"),
    )
    assert (points, series) == (2, len(LRS)), (points, series)
    best = sweep["best_trial"]
    expect(page.locator(f'table#trials tr.best[data-trial-id="{best["id"]}"]')).to_have_count(1)
    shot(page, "06-sweep")
    readme_shot(page, "#sweep-info", "readme-sweep")

    # Deploy the best trial from the page: lands on the deployment's page, which goes HEALTHY by itself.
    page.fill("#deploy-name", DEPLOYMENT)
    page.click("#deploy-best")
    page.wait_for_url(f"**/ui/deployments/{DEPLOYMENT}")
    deployment = member.wait_deployment(DEPLOYMENT, {"HEALTHY"}, timeout_s=180)
    assert deployment["current"]["checkpoint_path"] == best["checkpoint_path"], deployment
    expect(page.locator("#deployment-state")).to_have_text("HEALTHY", timeout=30_000)
    expect(page.locator("#serving-version")).to_have_text("v1", timeout=30_000)
    shot(page, "07-deployment")

    # Version 2 (another trial, over the REST API), then the page's rollback: version 3 serves v1's checkpoint.
    other = next(t for t in trials if t["id"] != best["id"])
    patched = member.http.patch(f"/v1/deployments/{DEPLOYMENT}", json={"source": {"trial_id": other["id"]}})
    assert patched.status_code == 200, patched.text
    member.wait_deployment(DEPLOYMENT, {"HEALTHY"}, timeout_s=180)
    expect(page.locator("#serving-version")).to_have_text("v2", timeout=60_000)
    expect(page.locator("#rollback-form")).to_be_visible()
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#rollback")
    deployment = wait_for(
        "version 3 healthy",
        lambda: (
            (d := member.http.get(f"/v1/deployments/{DEPLOYMENT}").json())["version"] == 3
            and d["state"] == "HEALTHY"
            and d
        ),
        timeout_s=180,
    )
    assert deployment["current"]["checkpoint_path"] == best["checkpoint_path"], deployment
    assert deployment["current"]["note"] == "rollback to version 1"
    expect(page.locator("#serving-version")).to_have_text("v3", timeout=60_000)
    expect(page.locator("#deployment-state")).to_have_text("HEALTHY")
    shot(page, "08-deployment-rolled-back")
