"""The dashboard (/ui) in a real headless Chromium, over the session's real service and Ray cluster.

Debian's ``chromium`` (scripts/ensure-chromium.sh installs it; ``make install`` and ``make test`` run it) is
driven through Playwright with ``executable_path``: Playwright's own browser download is never used. Where no
Chromium can be found, every test here is skipped with a message that says so; anything else that goes wrong
fails. One browser for the module; each key signs in in a context of its own (its own cookies).

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

from tests.integration.conftest import Api

pytestmark = pytest.mark.integration

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


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    path = chromium_path()
    if path is None:
        pytest.skip(
            "no Chromium found (looked for ORCHESTRATOR_CHROMIUM, then "
            f"{', '.join(CHROMIUM_NAMES)} on PATH): run `bash scripts/ensure-chromium.sh` "
            "(apt-get install chromium, as root) to run the dashboard's browser tests"
        )
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
