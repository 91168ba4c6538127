"""Take docs/dashboard.png: the dashboard's queues page over a SQLite store with some work in
it, in a headless Chromium (Debian's chromium and chromium-driver, and selenium).

    python scripts/dashboard_screenshot.py [OUTPUT.png]
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

from tests import _browser  # noqa: E402

import agentlease as al  # noqa: E402


def fill(q: al.Queue, rounds: int) -> None:
    """Work in several states: some done, some failed for good, some running, some waiting."""
    for queue, done, dead in (("emails", 12, 1), ("invoices", 5, 0), ("research", 3, 2)):
        q.enqueue_many(queue, [{"n": n} for n in range(done + dead + 4)])
        for job in q.claim(queue, done, lease_for=600):
            q.complete(job.lease, {"ok": True})
        for job in q.claim(queue, dead, lease_for=600) if dead else []:
            q.fail(job.lease, "upstream refused the request", retry_in=None)
        if rounds == 0:
            q.claim(queue, 2, lease_for=600)  # running now
    if rounds == 0:
        for account, tasks in (("account-42", 6), ("account-7", 3)):
            specs = [al.TaskSpec(payload=n, partition=account) for n in range(tasks)]
            q.enqueue_many("crm-sync", specs)
        q.claim("crm-sync", 2, lease_for=600)
        q.enqueue("reports", "weekly", delay=3600)


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "dashboard.png"
    logging.getLogger("agentlease").setLevel(logging.CRITICAL)  # no dead-letter lines
    why = _browser.missing()
    if why:
        sys.exit(f"no browser: {why}")
    out = out.resolve()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)  # the page names the store as it was given: sqlite:///agentlease.db
        url = "sqlite:///agentlease.db"
        q = al.Queue(al.connect(url))
        fill(q, 0)
        with _browser.served(url, token="demo") as base, _browser.browser(1100, 720) as driver:
            driver.get(base + "/")  # the first sample of the counts
            time.sleep(6)  # rates need two samples 5 s apart
            fill(q, 1)
            driver.get(base + "/")
            driver.save_screenshot(str(out))
        q.close()
        os.chdir(ROOT)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
