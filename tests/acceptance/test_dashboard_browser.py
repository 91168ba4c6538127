"""The dashboard in a real browser: ``agentlease dashboard`` serving a SQLite store in a process
of its own, looked at with a headless Chromium. Pages load, the counts shown match the store's
after enqueues, a write without the token is refused (also a form posted from another site
with the session cookie in the browser), and a dead letter is requeued after logging in.

Needs Debian's chromium and chromium-driver; skipped without them, unless
AGENTLEASE_REQUIRE_SERVICES=1, which makes that a failure.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from tests import _browser

pytestmark = pytest.mark.xdist_group("processes")

import agentlease as al  # noqa: E402
from agentlease._records import STATES  # noqa: E402

Q = "emails"
TOKEN = "browser-test-token"
LIVE = 300.0


@pytest.fixture
def driver() -> Any:
    why = _browser.missing()
    if why is not None:
        if os.environ.get("AGENTLEASE_REQUIRE_SERVICES") == "1":
            pytest.fail(f"no browser: {why} (AGENTLEASE_REQUIRE_SERVICES=1)")
        pytest.skip(f"no browser: {why}")
    with _browser.browser() as d:
        yield d


def shown_counts(driver: Any, queue: str) -> dict[str, int]:
    from selenium.webdriver.common.by import By

    row = driver.find_element(By.CSS_SELECTOR, f'tr[data-queue="{queue}"]')
    return {
        cell.get_attribute("data-state"): int(cell.text)
        for cell in row.find_elements(By.CSS_SELECTOR, "td[data-state]")
    }


def store_counts(q: al.Queue, queue: str) -> dict[str, int]:
    counts = q.stats(queue).counts
    return {state: counts.get(state, 0) for state in STATES}


def click_through(driver: Any, element: Any) -> None:
    """Click ``element`` and wait for the page it leads to (a click does not wait for it)."""
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.wait import WebDriverWait

    page = driver.find_element(By.TAG_NAME, "html")

    def left(_: Any) -> bool:
        try:
            page.tag_name  # noqa: B018  # raises once the page is gone (stale, or detached)
        except WebDriverException:
            return True
        return False

    element.click()
    WebDriverWait(driver, 30).until(left)
    WebDriverWait(driver, 30).until(
        lambda d: d.execute_script("return document.readyState") == "complete"
    )


def post_from_page(driver: Any, path: str, fields: dict[str, str]) -> str:
    """Post a form to ``path`` from the current page, as a page of the dashboard would (its
    policy lets no script fetch); return the error banner of the page it leads to."""
    from selenium.webdriver.common.by import By

    form = driver.execute_script(
        "const form = document.createElement('form');"
        "form.method = 'post'; form.action = arguments[0];"
        "for (const [name, value] of Object.entries(arguments[1])) {"
        "  const input = document.createElement('input');"
        "  input.name = name; input.value = value; form.appendChild(input); }"
        "const button = document.createElement('button'); form.appendChild(button);"
        "document.body.appendChild(form); return button;",
        path,
        fields,
    )
    click_through(driver, form)
    banners = driver.find_elements(By.ID, "error")
    return banners[0].text if banners else ""


def test_the_dashboard_in_a_browser(driver: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    url = f"sqlite:///{tmp_path / 'dash.db'}"
    q = al.Queue(al.connect(url))
    try:
        waiting = [e.task_id for e in q.enqueue_many(Q, [{"n": n} for n in range(5)])]
        q.enqueue_many("reports", ["r1", "r2"])
        dead = []
        for job in q.claim(Q, 2, lease_for=LIVE):
            q.fail(job.lease, f"mailbox full <{job.task_id}>", retry_in=None)
            dead.append(job.task_id)
        (held,) = q.claim(Q, 1, lease_for=LIVE)

        with _browser.served(url, token=TOKEN) as base:
            driver.get(base + "/")
            assert "queues" in driver.title
            assert shown_counts(driver, Q) == store_counts(q, Q)
            assert shown_counts(driver, "reports") == store_counts(q, "reports")
            assert shown_counts(driver, Q)["dead"] == 2

            q.enqueue_many(Q, ["more"] * 7)
            q.enqueue("newcomer", "x")
            driver.refresh()
            assert shown_counts(driver, Q) == store_counts(q, Q)
            assert shown_counts(driver, Q)["queued"] == 9
            assert shown_counts(driver, "newcomer")["queued"] == 1

            click_through(driver, driver.find_element(By.LINK_TEXT, Q))
            assert driver.title.startswith(f"queue {Q}")
            leases = driver.find_element(By.ID, "leases").text
            assert held.task_id in leases
            dead_table = driver.find_element(By.ID, "dead").text
            for task_id in dead:
                assert f"mailbox full <{task_id}>" in dead_table  # escaped, shown as text
            assert driver.find_elements(By.CSS_SELECTOR, "button.requeue") == []

            # Without the token: refused, nothing changes.
            refusal = post_from_page(driver, f"/queues/{Q}/requeue", {"all": "1"})
            assert refusal == "log in with the dashboard's token to requeue"
            assert len(q.dead(Q)) == 2
            refusal = post_from_page(driver, "/cancel", {"task_id": waiting[-1]})
            assert refusal == "log in with the dashboard's token to cancel"
            assert q.get(waiting[-1]).state == "queued"

            # The task page.
            driver.get(f"{base}/queues/{Q}")
            click_through(driver, driver.find_element(By.LINK_TEXT, dead[0]))
            state = driver.find_element(By.CSS_SELECTOR, 'td[data-field="state"]').text
            assert state == "dead"
            error = driver.find_element(By.CSS_SELECTOR, 'td[data-field="error"]').text
            assert "mailbox full" in error

            # Log in with the token.
            driver.get(f"{base}/login?next={quote(f'/queues/{Q}')}")
            driver.find_element(By.ID, "token").send_keys(TOKEN)
            click_through(driver, driver.find_element(By.ID, "login"))
            assert driver.title.startswith(f"queue {Q}")
            buttons = driver.find_elements(By.CSS_SELECTOR, "button.requeue")
            assert len(buttons) == 2

            # A form on another site posting to the dashboard: refused, though the browser
            # holds the session.
            forged = (
                "data:text/html,<form method=post "
                f"action='{base}/queues/{Q}/requeue'><input name=all value=1></form>"
                "<script>document.forms[0].submit()</script>"
            )
            driver.get(forged)
            assert "refused a write from another site" in driver.find_element(By.ID, "error").text
            assert len(q.dead(Q)) == 2

            # Cancel a queued task from its page: its attempts (none yet) and a reason.
            driver.get(f"{base}/tasks/{quote(waiting[-1])}")
            assert driver.find_element(By.ID, "no-attempts").text == "never claimed"
            form = driver.find_element(By.ID, "cancel")
            form.find_element(By.NAME, "reason").send_keys("not needed <any more>")
            click_through(driver, form.find_element(By.CSS_SELECTOR, "button.cancel-task"))
            assert driver.find_element(By.ID, "notice").text == "cancelled"
            state = driver.find_element(By.CSS_SELECTOR, 'td[data-field="state"]').text
            assert state == "cancelled"
            assert driver.find_elements(By.ID, "cancel") == []
            task = q.get(waiting[-1])
            assert (task.state, task.cancel_reason) == ("cancelled", "not needed <any more>")

            # The held task's page shows its running attempt; the workers page is linked.
            driver.get(f"{base}/tasks/{quote(held.task_id)}")
            outcome = driver.find_element(By.CSS_SELECTOR, 'td[data-field="outcome"]').text
            assert outcome == "running"
            click_through(driver, driver.find_element(By.ID, "nav-workers"))
            assert driver.title.startswith("workers")

            # Requeue one dead letter, then all.
            driver.get(f"{base}/queues/{Q}")
            row = driver.find_element(By.CSS_SELECTOR, f'tr[data-task="{dead[1]}"]')
            click_through(driver, row.find_element(By.CSS_SELECTOR, "button.requeue"))
            assert driver.find_element(By.ID, "notice").text == "requeued 1 dead tasks"
            assert q.get(dead[1]).state == "queued"
            assert [t.id for t in q.dead(Q)] == [dead[0]]
            click_through(driver, driver.find_element(By.CSS_SELECTOR, "#requeue-all button"))
            assert driver.find_element(By.ID, "notice").text == "requeued 1 dead tasks"
            assert q.dead(Q) == []
            assert driver.find_element(By.ID, "no-dead").text == "no dead letters"

            driver.get(base + "/")
            assert shown_counts(driver, Q) == store_counts(q, Q)
            assert shown_counts(driver, Q)["dead"] == 0

            png = tmp_path / "queues.png"
            assert driver.save_screenshot(str(png))
            assert png.stat().st_size > 1000
    finally:
        q.close()


def test_a_read_only_dashboard_offers_no_write(driver: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    url = f"sqlite:///{tmp_path / 'ro.db'}"
    q = al.Queue(al.connect(url))
    try:
        q.enqueue(Q, "x")
        (job,) = q.claim(Q, 1, lease_for=LIVE)
        q.fail(job.lease, "boom", retry_in=None)
        with _browser.served(url) as base:
            driver.get(f"{base}/queues/{Q}")
            assert driver.find_elements(By.CSS_SELECTOR, "button.requeue") == []
            assert driver.find_elements(By.LINK_TEXT, "log in") == []
            refusal = post_from_page(driver, f"/queues/{Q}/requeue", {"all": "1"})
            assert refusal.startswith("this dashboard is read-only")
            assert len(q.dead(Q)) == 1
    finally:
        q.close()
