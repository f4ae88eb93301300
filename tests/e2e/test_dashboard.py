"""The dashboard in a real browser: Debian's Chromium driven by Playwright against a real `orbit dev`.

Each page is photographed at 1280 px and at a phone's 390 px into `.local/screenshots/` (kept
out of git; `ORBIT_SCREENSHOTS` moves it) so that a reviewer can look at them. Under CI
(`ORBIT_REQUIRE_BROWSER=1`) a missing browser fails the run instead of skipping it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from pathlib import Path

import pytest

import orbit

from .conftest import Server, child_env, free_port
from .dashboard_demo import XSS, Demo, seed, start_worker

CHROMIUM = os.environ.get("ORBIT_CHROMIUM", "/usr/bin/chromium")
REQUIRE = os.environ.get("ORBIT_REQUIRE_BROWSER") == "1"
SHOTS = Path(os.environ.get("ORBIT_SCREENSHOTS", Path(__file__).resolve().parents[2] / ".local" / "screenshots"))
WIDTHS = {"desktop": (1280, 900), "phone": (390, 844)}
WAIT_MS = 15_000

try:
    from playwright import sync_api
except ImportError:
    if REQUIRE:
        raise
    pytest.skip("playwright is not installed (pip install -e '.[test]')", allow_module_level=True)
if not Path(CHROMIUM).exists() and not shutil.which("chromium"):
    if REQUIRE:
        raise RuntimeError(f"Chromium is required (ORBIT_REQUIRE_BROWSER=1) but {CHROMIUM} is missing")
    pytest.skip(f"no Chromium at {CHROMIUM}", allow_module_level=True)

pytestmark = pytest.mark.slow
expect = sync_api.expect


class Dev:
    """`orbit dev` in a private folder, its token, the demo data and a worker on its queues."""

    def __init__(self, base: Path) -> None:
        data = base / "data"
        logs = base / "logs"
        logs.mkdir()
        port = free_port()
        self.server = Server(["orbit", "dev", "--data-dir", str(data), "--port", str(port)], child_env(), port, logs)
        self.server.wait_ready()
        self.url = f"{self.server.base}/ui/"
        creds = json.loads((data / "credentials.json").read_text())
        self.token = creds["token"]
        self.client = orbit.Client(self.server.base, token=self.token)
        self.demo: Demo = seed(self.client)

    def close(self) -> None:
        # The demo's holder task runs until cancelled; the worker then drains at once.
        self.client.cancel_task(self.demo.extra["holder"], key(), "the test is over")
        self.demo.extra["worker"].stop()
        self.demo.extra["worker_thread"].join(10)
        self.client.close()
        self.server.kill()


@pytest.fixture(scope="module")
def dev(tmp_path_factory):
    d = Dev(tmp_path_factory.mktemp("dashboard"))
    yield d
    d.close()


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium"),
                              args=["--no-sandbox", "--disable-dev-shm-usage"])
        yield b
        b.close()


class Tab:
    """One signed-in page, with every console error, page error and dialog it met."""

    def __init__(self, browser, dev: Dev, width: str = "desktop") -> None:
        w, h = WIDTHS[width]
        self.width = width
        self.context = browser.new_context(viewport={"width": w, "height": h})
        self.page = self.context.new_page()
        self.page.set_default_timeout(WAIT_MS)
        self.problems: list[str] = []
        self.dialogs: list[str] = []
        self.page.on("console", self._console)
        self.page.on("pageerror", lambda e: self.problems.append(f"page error: {e}"))
        self.page.on("dialog", self._dialog)
        self.dev = dev

    def _console(self, message) -> None:
        # Refused requests (a bad token, a conflict) are logged by the browser and asserted by the
        # tests themselves; anything else on the console (a script error, a CSP refusal) is a fault.
        if message.type == "error" and not message.text.startswith("Failed to load resource"):
            self.problems.append(f"console {message.type}: {message.text}")

    def _dialog(self, dialog) -> None:
        self.dialogs.append(dialog.message)
        dialog.dismiss()

    def sign_in(self) -> Tab:
        self.page.goto(self.dev.url)
        self.page.get_by_label("API token").fill(self.dev.token)
        self.page.get_by_role("button", name="Sign in").click()
        expect(self.page.get_by_role("heading", name="Queues", exact=True)).to_be_visible()
        return self

    def go(self, fragment: str) -> None:
        self.page.goto(self.dev.url + fragment)

    def shot(self, name: str) -> None:
        SHOTS.mkdir(parents=True, exist_ok=True)
        self.page.wait_for_timeout(300)
        self.page.screenshot(path=str(SHOTS / f"{name}-{self.width}-{WIDTHS[self.width][0]}px.png"), full_page=True)

    def no_horizontal_scroll(self) -> None:
        width = self.page.evaluate("document.documentElement.scrollWidth")
        assert width <= WIDTHS[self.width][0], f"the page is {width} px wide at {WIDTHS[self.width][0]} px"

    def close(self) -> None:
        self.context.close()
        assert not self.problems, self.problems
        assert not self.dialogs, f"a dialog opened: {self.dialogs}"


@pytest.fixture
def tab(browser, dev):
    t = Tab(browser, dev)
    yield t
    t.close()


def key() -> str:
    return uuid.uuid4().hex


# ---------------------------------------------------------------- sign-in


def test_sign_in_with_the_keyboard_and_sign_out(tab: Tab, dev: Dev):
    page = tab.page
    page.goto(dev.url)
    expect(page.get_by_role("heading", name="Sign in to Orbit")).to_be_visible()
    tab.shot("sign-in")
    page.keyboard.type("orb_not_a_real_token")
    page.keyboard.press("Tab")
    page.keyboard.press("Enter")
    expect(page.locator("#signin-error")).to_contain_text("not valid")
    page.get_by_label("API token").fill(dev.token)
    page.keyboard.press("Tab")
    page.keyboard.press("Enter")
    expect(page.get_by_role("heading", name="Queues", exact=True)).to_be_visible()
    assert page.evaluate("sessionStorage.getItem('orbit.token')") == dev.token
    assert page.evaluate("localStorage.length") == 0  # kept for this browser tab only
    page.reload()
    expect(page.get_by_role("heading", name="Queues", exact=True)).to_be_visible()
    page.get_by_role("button", name="Sign out").click()
    expect(page.get_by_role("heading", name="Sign in to Orbit")).to_be_visible()
    assert page.evaluate("sessionStorage.getItem('orbit.token')") is None


def test_a_pasted_credentials_file_signs_in(tab: Tab, dev: Dev):
    tab.page.goto(dev.url)
    tab.page.get_by_label("API token").fill(json.dumps({"credential_id": "x", "token": dev.token}, indent=2))
    tab.page.get_by_role("button", name="Sign in").click()
    expect(tab.page.get_by_role("heading", name="Queues", exact=True)).to_be_visible()


def test_every_response_carries_a_strict_content_security_policy(dev: Dev):
    for path in ("/ui/", "/ui/app.js", "/ui/app.css", "/ui/views/queues.js"):
        r = dev.server.get(path)
        assert r.status_code == 200, path
        csp = r.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "unsafe-inline" not in csp and "unsafe-eval" not in csp
        assert r.headers["x-content-type-options"] == "nosniff"
    assert dev.server.get("/ui/../pyproject.toml").status_code == 404
    assert dev.server.get("/ui/%2e%2e/app.py").status_code == 404
    assert dev.server.get("/ui/nothing.js").status_code == 404
    html = dev.server.get("/ui/").text
    assert "<script>" not in html and "style=" not in html  # no inline script or style to allow


# ---------------------------------------------------------------- queues


def test_a_queues_counts_change_while_tasks_are_submitted_and_worked(tab: Tab, dev: Dev):
    c = dev.client
    queue = c.create_queue(key(), {"name": f"live-{key()[:6]}", "max_concurrency": 3, "rate_per_second": 100}).queue
    tab.sign_in()
    tab.go(f"#/queues/{queue.id}")
    page = tab.page
    expect(page.get_by_role("heading", name=queue.name)).to_be_visible()
    waiting = page.locator("[data-count=waiting] .count-value")
    expect(waiting).to_have_text("0")
    c.submit_tasks(queue.id, key(), [{"idempotency_key": key(), "payload": {"n": i}} for i in range(7)])
    expect(waiting).to_have_text("7")
    expect(page.locator("#task-list tbody tr")).to_have_count(7)
    tab.go("#/queues")
    row = page.locator("#queue-list tr", has=page.get_by_role("link", name=queue.name, exact=True))
    expect(row.locator("td[data-label=Waiting]")).to_have_text("7")
    tab.go(f"#/queues/{queue.id}")
    worker = start_worker(c, [queue.id], name="live-worker")
    try:
        expect(waiting).to_have_text("0")
        expect(page.locator("#throughput .hint")).to_contain_text("succeeded 7", timeout=20_000)
        expect(page.locator("#throughput svg polyline")).to_have_count(3)
        page.get_by_label("State").select_option("SUCCEEDED")
        expect(page.locator("#task-list tbody tr")).to_have_count(7)
    finally:
        worker.stop()


def test_pause_and_resume_with_a_reason_and_see_the_audit_records(tab: Tab, dev: Dev):
    c = dev.client
    queue = c.create_queue(key(), {"name": f"pausable-{key()[:6]}", "max_concurrency": 2, "rate_per_second": 10}).queue
    tab.sign_in()
    tab.go(f"#/queues/{queue.id}")
    page = tab.page
    pause = page.locator("#pause-form")
    pause.get_by_role("button", name="Pause").click()  # no reason: the browser refuses to send it
    assert pause.get_by_label("Reason").evaluate("el => el.validity.valueMissing")
    assert c.get_queue(queue.id).paused is False
    pause.get_by_label("Reason").fill("incident 4711: the payment provider is down")
    pause.get_by_role("button", name="Pause").click()
    expect(page.locator(".page-head .badge")).to_have_text("Paused")
    assert c.get_queue(queue.id).paused is True
    page.locator("#pause-form").get_by_label("Reason").fill("provider back <b>up</b>")
    page.locator("#pause-form").get_by_role("button", name="Resume").click()
    expect(page.locator(".page-head .badge")).to_have_text("Active")
    assert c.get_queue(queue.id).paused is False
    page.get_by_role("link", name="Audit log of this queue").click()
    records = page.locator("#audit-list tbody tr")
    expect(records.filter(has_text="incident 4711: the payment provider is down")).to_have_count(1)
    expect(records.filter(has_text="provider back <b>up</b>")).to_have_count(1)  # as text, not markup
    expect(records.first.locator("td[data-label=Action]")).to_have_text("queue.configure")
    tab.shot("audit")


def test_a_limits_change_made_elsewhere_is_shown_not_overwritten(tab: Tab, dev: Dev):
    c = dev.client
    queue = c.create_queue(key(), {"name": f"contested-{key()[:6]}", "max_concurrency": 2, "rate_per_second": 10}).queue
    tab.sign_in()
    tab.go(f"#/queues/{queue.id}")
    page = tab.page
    form = page.locator("#limits-form")
    expect(form).to_contain_text("Editing revision 1")
    c.configure_queue(queue.id, key(), {"expected_revision": "1", "reason": "someone else", "paused": False,
                                        "max_concurrency": 9, "rate_per_second": 10, "max_unfinished_tasks": 100})
    form.get_by_label("Max concurrency").fill("5")
    form.get_by_label("Reason").fill("mine")
    form.get_by_role("button", name="Save limits").click()
    expect(page.locator("#limits-form-result")).to_contain_text("STATE_CONFLICT")
    expect(page.locator("#stale-note")).to_contain_text("revision 2")
    assert c.get_queue(queue.id).max_concurrency == 9  # theirs stands
    page.get_by_role("button", name="Load current values").click()
    expect(page.locator("#limits-form").get_by_label("Max concurrency")).to_have_value("9")
    page.locator("#limits-form").get_by_label("Max concurrency").fill("5")
    page.locator("#limits-form").get_by_label("Reason").fill("mine, after reading theirs")
    page.locator("#limits-form").get_by_role("button", name="Save limits").click()
    expect(page.locator("#limits-form-result")).to_have_text("Saved.")
    assert c.get_queue(queue.id).max_concurrency == 5


# ---------------------------------------------------------------- tasks


def test_find_a_failed_tasks_error_and_attempts_from_the_front_page(tab: Tab, dev: Dev):
    tab.sign_in()
    page = tab.page
    failures = page.locator("#recent-failures")
    expect(failures).to_contain_text("card declined for invoice bad")
    failures.get_by_role("row").filter(has_text="invoice bad").get_by_role("link").first.click()
    expect(page.locator("#task-error")).to_contain_text("ATTEMPTS_EXHAUSTED")
    expect(page.locator("#task-error")).to_contain_text("RuntimeError: card declined for invoice bad")
    attempts = page.locator("#attempts > li.attempt")
    expect(attempts).to_have_count(2)
    for n in (1, 2):
        attempt = page.locator(f"#attempts > li[data-attempt='{n}']")
        expect(attempt).to_contain_text("FAILED")
        expect(attempt).to_contain_text("HANDLER_ERROR")
        expect(attempt).to_contain_text("Worker node")
        expect(attempt).to_contain_text("Lease")
    assert page.url.endswith(f"#/tasks/{dev.demo.failed_task_id}")


def test_a_blocked_task_says_which_limit_holds_it(tab: Tab, dev: Dev):
    tab.sign_in()
    tab.go(f"#/tasks/{dev.demo.blocked_task_id}")
    blockers = tab.page.locator("#blockers ul.blockers li")
    expect(blockers.first).to_contain_text(f"Resource key “{dev.demo.key_name}” concurrency: 1 of 1 permits in use")
    expect(tab.page.locator("#blockers li[data-layer=resource_key][data-control=max_concurrency]")).to_have_count(1)
    tab.go(f"#/queues/{dev.demo.blocked_queue_id}?state=WAITING")  # the task list says it too
    row = tab.page.locator("#task-list tbody tr").first
    expect(row.locator("td[data-label='Held by']")).to_have_text(f"key {dev.demo.key_name} concurrency 1/1")


def test_markup_from_the_api_is_shown_as_text(tab: Tab, dev: Dev):
    tab.sign_in()
    page = tab.page
    tab.go(f"#/tasks/{dev.demo.xss_task_id}")
    expect(page.locator("#payload pre")).to_contain_text(XSS)
    expect(page.locator("#task-error")).to_contain_text(XSS)
    page.wait_for_timeout(500)
    assert page.locator("img").count() == 0
    assert page.evaluate("document.querySelectorAll('[onerror]').length") == 0
    tab.go("#/events")
    expect(page.locator("#event-list")).to_contain_text(XSS)
    assert page.locator("img").count() == 0
    assert tab.dialogs == []


def test_cancel_a_waiting_task_with_a_reason(tab: Tab, dev: Dev):
    c = dev.client
    queue = c.create_queue(key(), {"name": f"cancel-{key()[:6]}", "max_concurrency": 1, "rate_per_second": 1}).queue
    task = c.submit_task(queue.id, key(), {"payload": {"x": 1}}).task
    tab.sign_in()
    tab.go(f"#/tasks/{task.id}")
    page = tab.page
    expect(page.locator("#blockers")).to_contain_text("Workers: no worker session claimed")
    page.locator("#cancel-form").get_by_label("Reason").fill("customer withdrew the order")
    page.get_by_role("button", name="Cancel task").click()
    expect(page.locator(".page-head .badge").first).to_have_text("CANCELLED")
    assert c.get_task(task.id).state == "CANCELLED"
    expect(page.locator("#task-audit")).to_contain_text("customer withdrew the order")


def test_review_a_task_whose_outcome_is_unknown(tab: Tab, dev: Dev):
    tab.sign_in()
    page = tab.page
    tab.go(f"#/queues")
    row = page.locator("#queue-list tbody tr", has=page.get_by_role("link", name=re.compile("^ledger-")))
    expect(row.locator("td[data-label='Needs review']")).to_have_text("1")
    tab.go(f"#/tasks/{dev.demo.review_task_id}")
    expect(page.locator("#blockers")).to_contain_text("waits for a person")
    expect(page.locator("#attempts > li[data-attempt='1']")).to_contain_text("LEASE_LOST")
    expect(page.locator("#attempts > li[data-attempt='1']")).to_contain_text("vanishing-host")
    tab.shot("task-needs-review")
    form = page.locator("#review-form")
    form.get_by_label("Resolution").select_option("RETRY")
    form.get_by_label("Reason").fill("the bank shows no transfer: run it again")
    form.get_by_role("button", name="Resolve").click()
    expect(page.locator(".page-head .badge").first).not_to_have_text("NEEDS_REVIEW")
    assert dev.client.get_task(dev.demo.review_task_id).state != "NEEDS_REVIEW"
    expect(page.locator("#task-audit")).to_contain_text("the bank shows no transfer: run it again")


# ---------------------------------------------------------------- the other pages


def test_schedules_keys_application_events_and_audit_pages(tab: Tab, dev: Dev):
    tab.sign_in()
    page = tab.page
    tab.go("#/schedules")
    page.get_by_role("link", name=re.compile("^nightly-")).first.click()
    expect(page.locator("#runs")).to_be_visible()
    tab.go("#/resource-keys")
    expect(page.locator(f"[data-key='{dev.demo.key_name}']")).to_be_visible()
    row = page.locator("#key-list tr", has=page.locator(f"[data-key='{dev.demo.key_name}']"))
    expect(row).to_contain_text("1 / 1")
    tab.go("#/application")
    expect(page.get_by_role("heading", name="Application dev")).to_be_visible()
    tab.go("#/events?type=task.failed")
    expect(page.get_by_label("task.failed")).to_be_checked()
    expect(page.locator("#event-list tbody tr").first).to_be_visible()
    types = page.locator("#event-list tbody td[data-label=Type]").all_inner_texts()
    assert types and set(types) == {"task.failed"}
    tab.go("#/audit")
    expect(page.locator("#audit-list tbody tr").first).to_be_visible()


def test_the_event_feed_is_live(tab: Tab, dev: Dev):
    c = dev.client
    queue = c.create_queue(key(), {"name": f"feed-{key()[:6]}", "max_concurrency": 1, "rate_per_second": 1}).queue
    tab.sign_in()
    tab.go("#/events")
    page = tab.page
    expect(page.locator("#event-list tbody tr").first).to_be_visible()
    task = c.submit_task(queue.id, key(), {"payload": {}}).task
    expect(page.locator("#event-list tbody tr").first).to_contain_text("task.submitted")
    expect(page.locator("#event-list tbody tr").first.get_by_role("link")).to_have_attribute("href", f"#/tasks/{task.id}")


def test_every_control_has_a_label(tab: Tab, dev: Dev):
    tab.sign_in()
    for fragment in ("#/queues", f"#/queues/{dev.demo.queue_id}", f"#/tasks/{dev.demo.blocked_task_id}", "#/events",
                     "#/audit", "#/application"):
        tab.go(fragment)
        tab.page.wait_for_timeout(800)
        unlabelled = tab.page.evaluate("""() => [...document.querySelectorAll('input, select, textarea, button')]
            .filter((el) => !(el.labels && el.labels.length) && !el.getAttribute('aria-label')
                     && !(el.textContent || '').trim())
            .map((el) => el.outerHTML.slice(0, 80))""")
        assert unlabelled == [], (fragment, unlabelled)


def test_queues_page_by_page_and_by_name(tab: Tab, dev: Dev):
    c = dev.client
    tag = key()[:6]
    for i in range(51):
        c.create_queue(key(), {"name": f"many-{tag}-{i:02d}", "max_concurrency": 1, "rate_per_second": 1})
    tab.sign_in()
    page = tab.page
    rows = page.locator("#queue-list tbody tr")
    expect(rows).to_have_count(50)
    page.get_by_role("button", name="Next →").click()
    expect(page.locator(".pager .page-no")).to_have_text("Page 2")
    expect(rows.last).to_contain_text(f"many-{tag}-50")
    page.get_by_role("button", name="← Previous").click()
    expect(page.locator(".pager .page-no")).to_have_text("Page 1")
    page.get_by_label("Find a queue").fill(f"many-{tag}-07")
    page.get_by_label("Find a queue").press("Enter")
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text(f"many-{tag}-07")


# ---------------------------------------------------------------- both widths


@pytest.mark.parametrize("width", ["desktop", "phone"])
def test_every_page_fits_and_is_photographed(browser, dev: Dev, width: str):
    t = Tab(browser, dev, width)
    try:
        t.sign_in()
        d = dev.demo
        pages = {
            "queues": ("#/queues", "#queue-list table"),
            "queue": (f"#/queues/{d.queue_id}", "#throughput svg"),
            "task-failed": (f"#/tasks/{d.failed_task_id}", "#attempts li.attempt"),
            "task-blocked": (f"#/tasks/{d.blocked_task_id}", "#blockers li"),
            "task-markup": (f"#/tasks/{d.xss_task_id}", "#payload pre"),
            "task-review": (f"#/tasks/{d.review_task_id}", "#attempts li.attempt"),
            "schedules": ("#/schedules", "#schedule-list table"),
            "schedule": (f"#/schedules/{d.schedule_id}", "#runs"),
            "resource-keys": ("#/resource-keys", "#key-list table"),
            "application": ("#/application", ".counts .meter"),
            "events": ("#/events", "#event-list tbody tr"),
            "audit": ("#/audit", "#audit-list table"),
        }
        for name, (fragment, ready) in pages.items():
            t.go(fragment)
            t.page.locator(ready).first.wait_for()
            t.no_horizontal_scroll()
            t.shot(name)
    finally:
        t.close()
