"""The web dashboard over HTTP, on every store: pages show what the store holds, every dynamic
text is escaped, writes need the token and a request from the dashboard itself, and a store
that cannot be reached gives a page with a banner (503), not a stack trace. ``/metrics``
matches the store in the Prometheus text format, scraped in process and from a real
``agentlease dashboard``."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest

import agentlease as al
from agentlease._records import STATES
from agentlease.dashboard import create_app
from agentlease.dashboard._app import COOKIE
from tests.conftest import require

Q = "emails"
TOKEN = "s3cret-token"
SITE = "http://dashboard.test"
LIVE = 60.0
EVIL = "<script>alert('x')</script>"


@asynccontextmanager
async def client(
    app_factory: Callable[[], object],
) -> AsyncIterator[httpx.AsyncClient]:
    app = app_factory()
    async with (
        app.router.lifespan_context(app),  # type: ignore[attr-defined]
        httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url=SITE) as c,  # type: ignore[arg-type]
    ):
        yield c


def counts_of(html: str, queue: str) -> dict[str, int]:
    row = re.search(rf'<tr data-queue="{re.escape(queue)}">(.*?)</tr>', html, re.S)
    assert row is not None, html
    return {s: int(n) for s, n in re.findall(r'data-state="(\w+)">(\d+)<', row.group(1))}


def fill(q: al.Queue) -> dict[str, str]:
    """Three queued, one leased, two dead (one with a traceback): their ids by role."""
    ids = [e.task_id for e in q.enqueue_many(Q, [{"to": EVIL}, "b", "c", "d", "e", "f"])]
    leased, dead1, dead2 = q.claim(Q, 3, lease_for=LIVE)
    q.progress(leased.lease, {"step": EVIL})
    try:
        raise ValueError(f"bad address {EVIL}")
    except ValueError as exc:
        q.fail(dead1.lease, exc, retry_in=None)
    q.fail(dead2.lease, "gave up", retry_in=None)
    return {
        "first": ids[0],
        "leased": leased.task_id,
        "dead1": dead1.task_id,
        "dead2": dead2.task_id,
    }


async def test_pages_show_the_store_and_escape_everything(store) -> None:
    q = store.queue()
    ids = fill(q)
    async with client(lambda: create_app(queue=store.aqueue)) as c:
        page = await c.get("/")
        assert page.status_code == 200
        assert counts_of(page.text, Q) == {s: q.stats(Q).counts.get(s, 0) for s in STATES}
        assert counts_of(page.text, Q)["queued"] == 3
        assert counts_of(page.text, Q)["leased"] == 1
        assert counts_of(page.text, Q)["dead"] == 2
        assert "done/min" in page.text
        assert "measured by this dashboard" in page.text

        page = await c.get(f"/queues/{Q}")
        assert page.status_code == 200
        leases = page.text.split('id="leases"')[1].split("</table>")[0]
        assert ids["leased"] in leases
        assert q.inspect(Q)[0].holder is None
        assert '<td class="name holder">-</td>' in leases
        dead = page.text.split('id="dead"')[1].split("</table>")[0]
        assert ids["dead1"] in dead
        assert ids["dead2"] in dead
        assert "ValueError: bad address &lt;script&gt;" in dead
        assert "requeue" not in dead  # read-only: no buttons

        page = await c.get(f"/tasks/{ids['dead1']}")
        assert page.status_code == 200
        assert "traceback (its end)" in page.text
        assert "raise ValueError(f&#34;bad address {EVIL}&#34;)" in page.text

        page = await c.get(f"/tasks/{ids['leased']}")
        assert '<pre id="progress">' in page.text
        page = await c.get(f"/tasks/{ids['first']}")
        assert "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;" in page.text

        for path in ("/", f"/queues/{Q}", *(f"/tasks/{i}" for i in ids.values())):
            page = await c.get(path)
            assert "<script" not in page.text, path
            assert "default-src 'none'" in page.headers["content-security-policy"]
            assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
            assert page.headers["x-frame-options"] == "DENY"
            assert page.headers["cache-control"] == "no-store"


async def test_unknown_names_are_404_and_bad_names_400(store) -> None:
    store.queue().enqueue(Q, "x")
    async with client(lambda: create_app(queue=store.aqueue)) as c:
        page = await c.get("/queues/nope")
        assert page.status_code == 404
        assert "no queue named" in page.text
        page = await c.get("/tasks/no-such-task")
        assert page.status_code == 404
        page = await c.get("/queues/bad%20name")
        assert page.status_code == 400
        assert 'class="banner error"' in page.text


async def test_an_empty_store_says_so(store) -> None:
    async with client(lambda: create_app(queue=store.aqueue)) as c:
        page = await c.get("/")
        assert page.status_code == 200
        assert "no queues yet" in page.text


async def test_a_read_only_dashboard_refuses_every_write(store) -> None:
    q = store.queue()
    ids = fill(q)
    async with client(lambda: create_app(queue=store.aqueue)) as c:
        for headers in ({"origin": SITE}, {"origin": SITE, "authorization": f"Bearer {TOKEN}"}):
            r = await c.post(f"/queues/{Q}/requeue", data={"all": "1"}, headers=headers)
            assert r.status_code == 403
            assert "read-only" in r.text
        r = await c.post("/login", data={"token": TOKEN}, headers={"origin": SITE})
        assert r.status_code == 403
    assert {t.id for t in q.dead(Q)} == {ids["dead1"], ids["dead2"]}


async def test_requeue_needs_the_token_and_a_request_from_the_dashboard(store) -> None:
    q = store.queue()
    ids = fill(q)
    form = {"task_id": ids["dead1"]}
    async with client(lambda: create_app(queue=store.aqueue, token=TOKEN)) as c:
        refused = [
            {"origin": SITE},  # no token
            {"origin": SITE, "authorization": "Bearer wrong"},
            {"origin": SITE, "authorization": f"Bearer {TOKEN}x"},
            {"origin": "http://evil.test", "authorization": f"Bearer {TOKEN}"},
            {"referer": "http://evil.test/page", "authorization": f"Bearer {TOKEN}"},
            {"origin": SITE, "cookie": f"{COOKIE}={TOKEN}"},  # the token is not the session
        ]
        for headers in refused:
            r = await c.post(f"/queues/{Q}/requeue", data=form, headers=headers)
            assert r.status_code == 403, headers
        assert len(q.dead(Q)) == 2

        # The page offers a log-in that comes back to it, not buttons.
        page = await c.get(f"/queues/{Q}")
        assert f'<a href="/login?next=/queues/{Q}">log in</a> to requeue' in page.text
        assert 'class="requeue"' not in page.text
        page = await c.get(f"/tasks/{ids['dead1']}")
        assert 'id="requeue"' not in page.text

        # A script: the token in a header, no Origin needed.
        r = await c.post(
            f"/queues/{Q}/requeue", data=form, headers={"authorization": f"Bearer {TOKEN}"}
        )
        assert r.status_code == 303
        assert r.headers["location"] == f"/queues/{Q}?requeued=1"
        assert q.get(ids["dead1"]).state == "queued"
        page = await c.get(r.headers["location"])
        assert "requeued 1 dead tasks" in page.text


async def test_a_browser_session_logs_in_and_requeues_one_then_all(store) -> None:
    q = store.queue()
    ids = fill(q)
    q.fail(q.claim(Q, lease_for=LIVE)[0].lease, "third", retry_in=None)
    async with client(lambda: create_app(queue=store.aqueue, token=TOKEN)) as c:
        r = await c.post("/login", data={"token": "wrong", "next": "/"}, headers={"origin": SITE})
        assert r.status_code == 403
        assert "wrong token" in r.text
        assert COOKIE not in c.cookies
        r = await c.post(
            "/login", data={"token": TOKEN, "next": "/"}, headers={"origin": "http://evil.test"}
        )
        assert r.status_code == 403
        assert COOKIE not in c.cookies

        r = await c.post(
            "/login",
            data={"token": TOKEN, "next": f"/queues/{Q}"},
            headers={"origin": SITE},
        )
        assert r.status_code == 303
        assert r.headers["location"] == f"/queues/{Q}"
        cookie = r.headers["set-cookie"]
        assert "httponly" in cookie.lower()
        assert "samesite=strict" in cookie.lower()
        assert TOKEN not in cookie

        page = await c.get(f"/queues/{Q}")
        assert 'id="requeue-all"' in page.text
        assert page.text.count('class="requeue"') == 3
        page = await c.get(f"/tasks/{ids['dead1']}")
        assert 'id="requeue"' in page.text
        page = await c.get(f"/tasks/{ids['leased']}")
        assert 'id="requeue"' not in page.text

        # The cookie alone is not enough: a post from another site is refused.
        r = await c.post(
            f"/queues/{Q}/requeue", data={"all": "1"}, headers={"origin": "http://evil.test"}
        )
        assert r.status_code == 403
        r = await c.post(f"/queues/{Q}/requeue", data={"all": "1"})  # no Origin, no Referer
        assert r.status_code == 403
        assert len(q.dead(Q)) == 3

        r = await c.post(
            f"/queues/{Q}/requeue", data={"task_id": ids["dead2"]}, headers={"origin": SITE}
        )
        assert r.status_code == 303
        assert q.get(ids["dead2"]).state == "queued"
        r = await c.post(
            f"/queues/{Q}/requeue", data={"all": "1"}, headers={"referer": f"{SITE}/queues/{Q}"}
        )
        assert r.status_code == 303
        assert r.headers["location"] == f"/queues/{Q}?requeued=2"
        assert q.dead(Q) == []
        assert q.stats(Q).counts.get("queued") == 5

        r = await c.post(f"/queues/{Q}/requeue", data={}, headers={"origin": SITE})
        assert r.status_code == 400  # neither ids nor all

        r = await c.post("/logout", headers={"origin": SITE})
        assert r.status_code == 303
        r = await c.post(f"/queues/{Q}/requeue", data={"all": "1"}, headers={"origin": SITE})
        assert r.status_code == 403


async def test_log_in_goes_back_only_to_a_page_of_the_dashboard(store) -> None:
    async with client(lambda: create_app(queue=store.aqueue, token=TOKEN)) as c:
        for nxt in ("https://evil.test/", "//evil.test/", "/\\evil.test"):
            r = await c.post("/login", data={"token": TOKEN, "next": nxt}, headers={"origin": SITE})
            assert r.status_code == 303
            assert r.headers["location"] == "/"


async def test_a_store_that_cannot_be_read_gives_a_banner_not_a_stack_trace(
    tmp_path: Path,
) -> None:
    missing = tmp_path / "nowhere.db"
    async with client(lambda: create_app(f"sqlite:///{missing}")) as c:
        page = await c.get("/")
        assert page.status_code == 503
        assert 'class="banner error"' in page.text
        assert "the store cannot be read" in page.text
        assert "Traceback" not in page.text
    assert not missing.exists()  # not created by the dashboard


async def test_a_store_that_goes_away_gives_a_banner_and_comes_back(tmp_path: Path) -> None:
    path = tmp_path / "q.db"
    q = al.Queue(al.connect(f"sqlite:///{path}"))
    q.enqueue(Q, "x")
    q.close()
    async with client(lambda: create_app(f"sqlite:///{path}")) as c:
        assert (await c.get("/")).status_code == 200
        path.rename(tmp_path / "elsewhere.db")
        for suffix in ("-wal", "-shm"):
            if Path(f"{path}{suffix}").exists():
                Path(f"{path}{suffix}").rename(tmp_path / f"elsewhere.db{suffix}")
        page = await c.get("/")
        assert page.status_code in (200, 503)  # an open connection may still read the file
        (tmp_path / "elsewhere.db").rename(path)
        page = await c.get("/")
        assert page.status_code == 200
        assert counts_of(page.text, Q)["queued"] == 1


async def test_an_unreachable_redis_gives_a_banner() -> None:
    require("redis", "the redis extra")
    async with client(lambda: create_app("redis://127.0.0.1:1/0?connect_timeout=1")) as c:
        page = await c.get("/")
    assert page.status_code == 503
    assert "the store cannot be read" in page.text
    assert "Traceback" not in page.text


async def test_requests_to_another_host_name_are_refused(store) -> None:
    app = lambda: create_app(queue=store.aqueue, allowed_hosts=["127.0.0.1", "localhost"])  # noqa: E731
    async with client(app) as c:
        r = await c.get("/")
        assert r.status_code == 400  # dashboard.test is not an allowed host


def test_the_options_are_checked() -> None:
    with pytest.raises(al.InvalidInput):
        create_app()
    with pytest.raises(al.InvalidInput):
        create_app("memory://", token="")
    with pytest.raises(al.InvalidInput):
        create_app("memory://", refresh=-1)
    with pytest.raises(al.InvalidInput):
        create_app("memory://", metrics_interval=-1)


def test_without_the_extra_the_command_names_it() -> None:
    code = (
        "import sys\n"
        "sys.modules['starlette'] = None\n"
        "sys.argv = ['agentlease', 'dashboard', '--backend', 'memory://']\n"
        "from agentlease.cli import main\n"
        "main()\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 2, out.stderr
    assert "pip install 'agentlease[dashboard]'" in out.stderr
    assert "Traceback" not in out.stderr


def test_the_command_refuses_a_missing_sqlite_file(tmp_path: Path) -> None:
    missing = tmp_path / "typo.db"
    out = subprocess.run(
        [sys.executable, "-m", "agentlease", "dashboard", "--backend", f"sqlite:///{missing}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 2, out.stderr
    assert "no SQLite database" in out.stderr
    assert not missing.exists()


async def test_task_ids_with_any_allowed_character_have_working_links(store) -> None:
    q = store.queue()
    odd = "tenant/a+b=c@d:e.f_g-h"
    q.enqueue(Q, "x", id=odd)
    q.claim(Q, lease_for=LIVE)
    async with client(lambda: create_app(queue=store.aqueue)) as c:
        page = await c.get(f"/queues/{Q}")
        (link,) = re.findall(r'<a href="(/tasks/[^"]+)">', page.text)
        task = await c.get(link.replace("&amp;", "&"))
        assert task.status_code == 200
        assert f"<h1>task {odd}</h1>" in task.text


async def test_mounted_under_a_path_its_links_and_writes_stay_under_it(store) -> None:
    from starlette.applications import Starlette
    from starlette.routing import Mount

    q = store.queue()
    ids = fill(q)
    inner = create_app(queue=store.aqueue, token=TOKEN)

    def outer() -> Starlette:
        mount = Mount("/ops/dash", app=inner)
        return Starlette(routes=[mount], lifespan=inner.router.lifespan_context)

    async with client(outer) as c:
        page = await c.get("/ops/dash/")
        assert page.status_code == 200
        assert f'href="/ops/dash/queues/{Q}"' in page.text
        page = await c.get(f"/ops/dash/queues/{Q}")
        assert f'href="/ops/dash/tasks/{ids["dead1"]}"' in page.text
        login = {"token": TOKEN, "next": f"/queues/{Q}"}
        r = await c.post("/ops/dash/login", data=login, headers={"origin": SITE})
        assert r.status_code == 303
        assert r.headers["location"] == f"/ops/dash/queues/{Q}"
        r = await c.post(
            f"/ops/dash/queues/{Q}/requeue", data={"all": "1"}, headers={"origin": SITE}
        )
        assert r.status_code == 303
        assert r.headers["location"] == f"/ops/dash/queues/{Q}?requeued=2"
    assert q.dead(Q) == []


def _metrics(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _expected(
    q: al.Queue, workers: dict[str, int]
) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    out: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for name in q.queues():
        counts = q.stats(name).counts
        on = {"queue": name}
        for state in STATES:
            out[("agentlease_queue_tasks", frozenset({**on, "state": state}.items()))] = counts.get(
                state, 0
            )
        out[("agentlease_queue_leases", frozenset(on.items()))] = counts.get("leased", 0)
        out[("agentlease_queue_dead_letters", frozenset(on.items()))] = counts.get("dead", 0)
        out[("agentlease_queue_workers", frozenset(on.items()))] = workers.get(name, 0)
    out[("agentlease_workers", frozenset())] = sum(1 for _ in q.workers())
    return out


async def test_metrics_give_each_queue_s_depth_leases_workers_and_dead_letters(store) -> None:
    """``/metrics`` in the Prometheus text format matches the store; it is read at most once
    per interval (a scrape within it gives the same values), needs no token, and names no
    state the store does not know."""
    require("prometheus_client", "the prometheus extra")
    q = store.queue()
    fill(q)
    q.enqueue("other", "x")
    q.register_worker("w1", {"queues": [Q], "host": "h"}, ttl=LIVE)
    q.register_worker("w2", {"queues": [Q, "other"], "host": "h"}, ttl=LIVE)
    app = lambda: create_app(queue=store.aqueue, token=TOKEN, metrics_interval=3600)  # noqa: E731
    async with client(app) as c:
        r = await c.get("/metrics")  # no token
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
        got = _metrics(r.text)
        got.pop(("agentlease_queue_oldest_queued_age_seconds", frozenset({("queue", Q)})))
        got.pop(("agentlease_queue_oldest_queued_age_seconds", frozenset({("queue", "other")})))
        assert got == _expected(q, {Q: 2, "other": 1})
        assert got[("agentlease_queue_tasks", frozenset({("queue", Q), ("state", "queued")}))] == 3
        assert got[("agentlease_queue_leases", frozenset({("queue", Q)}))] == 1
        assert got[("agentlease_queue_dead_letters", frozenset({("queue", Q)}))] == 2
        assert got[("agentlease_workers", frozenset())] == 2
        q.enqueue_many(Q, ["g", "h"])
        again = await c.get("/metrics")
        assert again.text == r.text  # within the interval: the same read
    async with client(lambda: create_app(queue=store.aqueue, metrics_interval=0)) as c:
        got = _metrics((await c.get("/metrics")).text)
    assert got[("agentlease_queue_tasks", frozenset({("queue", Q), ("state", "queued")}))] == 5
    assert {
        k: v for k, v in got.items() if k[0] != "agentlease_queue_oldest_queued_age_seconds"
    } == (_expected(q, {Q: 2, "other": 1}))


async def test_metrics_follow_the_host_rules_and_a_store_down_is_a_503(
    tmp_path: Path, store
) -> None:
    app = lambda: create_app(queue=store.aqueue, allowed_hosts=["127.0.0.1", "localhost"])  # noqa: E731
    async with client(app) as c:
        assert (await c.get("/metrics")).status_code == 400  # dashboard.test is not allowed
    async with client(lambda: create_app(f"sqlite:///{tmp_path / 'nowhere.db'}")) as c:
        r = await c.get("/metrics")
    assert r.status_code == 503
    assert r.text.startswith("# the store cannot be read")
    assert "Traceback" not in r.text


def test_metrics_label_values_are_escaped() -> None:
    from agentlease.dashboard._metrics import _label

    assert _label('a"b\\c\nd') == 'a\\"b\\\\c\\nd'


def test_the_dashboard_command_serves_metrics(tmp_path: Path) -> None:
    """A real ``agentlease dashboard`` process, scraped over HTTP."""
    import socket
    import time

    require("prometheus_client", "the prometheus extra")
    url = f"sqlite:///{tmp_path / 'd.db'}"
    with al.Queue(al.connect(url)) as q:
        q.enqueue_many(Q, ["a", "b"])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    process = subprocess.Popen(
        [sys.executable, "-m", "agentlease", "dashboard", "--backend", url, "--port", str(port)],
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
                break
            except httpx.TransportError:
                assert process.poll() is None
                assert time.monotonic() < deadline
                time.sleep(0.1)
    finally:
        process.terminate()
        process.wait(timeout=60)
    assert r.status_code == 200
    got = _metrics(r.text)
    assert got[("agentlease_queue_tasks", frozenset({("queue", Q), ("state", "queued")}))] == 2
    assert got[("agentlease_workers", frozenset())] == 0


HOLDER = "build-07.example:4242:a1b2c3"


async def test_workers_page_lists_live_workers_with_their_tasks(store) -> None:
    q = store.queue()
    a, b = (e.task_id for e in q.enqueue_many(Q, ["a", "b"]))
    q.claim(Q, 1, lease_for=LIVE, holder=HOLDER)
    info = {
        "host": "build-07.example",
        "pid": 4242,
        "queues": [Q, "reports"],
        "concurrency": 3,
        "started": 1_700_000_000.0,
        "tasks": [a, EVIL],
    }
    q.register_worker(HOLDER, info, ttl=LIVE)
    async with client(lambda: create_app(queue=store.aqueue)) as c:
        page = await c.get("/")
        assert 'href="/workers"' in page.text  # linked from the header of every page
        page = await c.get("/workers")
        assert page.status_code == 200
        table = page.text.split('id="workers"')[1].split("</table>")[0]
        assert f'href="/workers/{HOLDER}"' in table.replace("%3A", ":")
        assert "build-07.example:4242" in table
        assert f'href="/queues/{Q}"' in table
        assert f'href="/tasks/{a}"' in table
        assert "&lt;script&gt;" in table
        assert "2023-11-14 22:13:20 UTC" in table  # started
        left = re.search(r"<td>(\d+\.\d)s</td>\s*<td class=\"name\"><a href=\"/tasks/", table)
        assert left is not None, table
        assert 0 < float(left.group(1)) <= LIVE  # seconds to expiry
        assert "<script" not in page.text

        page = await c.get(f"/workers/{HOLDER}")
        assert page.status_code == 200
        assert f"worker {HOLDER}" in page.text
        page = await c.get("/workers/no-such-worker")
        assert page.status_code == 404
        assert "no live worker" in page.text

        q.unregister_worker(HOLDER)
        page = await c.get("/workers")
        assert 'id="no-workers"' in page.text
    assert q.get(b).state == "queued"


async def test_live_leases_show_their_holder_and_a_requested_cancel(store) -> None:
    q = store.queue()
    q.enqueue_many(Q, ["a", "b"])
    first, second = q.claim(Q, 2, lease_for=LIVE, holder=HOLDER)
    assert q.cancel(first.task_id, "operator <said> stop").outcome == "requested"
    async with client(lambda: create_app(queue=store.aqueue)) as c:
        page = await c.get(f"/queues/{Q}")
    leases = page.text.split('id="leases"')[1].split("</table>")[0]
    rows = dict(re.findall(r'<tr data-task="([^"]+)">(.*?)</tr>', leases, re.S))
    assert set(rows) == {first.task_id, second.task_id}
    for row in rows.values():
        (link,) = re.findall(r'<a href="(/workers/[^"]+)">', row)
        assert link.replace("%3A", ":") == f"/workers/{HOLDER}"
    assert "cancel requested" in rows[first.task_id]
    assert 'title="operator &lt;said&gt; stop"' in rows[first.task_id]
    assert "cancel requested" not in rows[second.task_id]


async def test_the_task_page_shows_its_attempt_history(store) -> None:
    q = store.queue()
    task_id = q.enqueue(Q, "x").task_id
    async with client(lambda: create_app(queue=store.aqueue)) as c:
        page = await c.get(f"/tasks/{task_id}")
        assert 'id="no-attempts"' in page.text
        (job,) = q.claim(Q, lease_for=LIVE, holder=HOLDER)
        q.fail(job.lease, ValueError("nope"), retry_in=0)
        (job,) = q.claim(Q, lease_for=LIVE, holder="other:1:x")
        page = await c.get(f"/tasks/{task_id}")
    table = page.text.split('id="attempts"')[1].split("</table>")[0]
    rows = re.findall(r'<tr data-attempt="(\d+)">(.*?)</tr>', table, re.S)
    assert [n for n, _ in rows] == ["1", "2"]
    assert "failed" in rows[0][1]
    assert "ValueError" in rows[0][1]
    assert HOLDER in rows[0][1].replace("%3A", ":")
    assert "running" in rows[1][1]
    assert "other:1:x" in rows[1][1]
    assert re.search(r"<td>\d+\.\ds</td>", rows[0][1])  # run time


async def test_cancel_needs_the_token_and_a_request_from_the_dashboard(store) -> None:
    q = store.queue()
    waiting, leased, done = (e.task_id for e in q.enqueue_many(Q, ["a", "b", "c"]))
    _, held, finished = q.claim(Q, 3, lease_for=LIVE, holder=HOLDER)
    q.release(_.lease)  # back to queued
    q.complete(finished.lease, "ok")
    waiting, leased, done = _.task_id, held.task_id, finished.task_id
    async with client(lambda: create_app(queue=store.aqueue)) as ro:
        r = await ro.post(
            "/cancel", data={"task_id": waiting}, headers={"authorization": f"Bearer {TOKEN}"}
        )
        assert r.status_code == 403
        assert "read-only" in r.text
    async with client(lambda: create_app(queue=store.aqueue, token=TOKEN)) as c:
        refused = [
            {"origin": SITE},
            {"origin": SITE, "authorization": "Bearer wrong"},
            {"origin": "http://evil.test", "authorization": f"Bearer {TOKEN}"},
            {"referer": "http://evil.test/x", "authorization": f"Bearer {TOKEN}"},
            {"origin": SITE, "cookie": f"{COOKIE}={TOKEN}"},
        ]
        for headers in refused:
            r = await c.post("/cancel", data={"task_id": waiting}, headers=headers)
            assert r.status_code == 403, headers
        assert q.get(waiting).state == "queued"

        page = await c.get(f"/tasks/{waiting}")
        assert 'id="cancel"' not in page.text
        assert "to cancel" in page.text  # a log-in link

        r = await c.post("/login", data={"token": TOKEN, "next": "/"}, headers={"origin": SITE})
        assert r.status_code == 303
        page = await c.get(f"/tasks/{waiting}")
        assert 'id="cancel"' in page.text
        page = await c.get(f"/tasks/{done}")
        assert 'id="cancel"' not in page.text  # finished: nothing to cancel
        r = await c.post("/cancel", data={"task_id": waiting})  # no Origin: refused
        assert r.status_code == 403

        r = await c.post(
            "/cancel", data={"task_id": waiting, "reason": "wrong input"}, headers={"origin": SITE}
        )
        assert r.status_code == 303
        assert r.headers["location"] == f"/tasks/{waiting}?cancel=cancelled"
        task = q.get(waiting)
        assert (task.state, task.cancel_reason) == ("cancelled", "wrong input")
        page = await c.get(r.headers["location"])
        assert 'id="notice"' in page.text
        assert 'id="cancel"' not in page.text

        r = await c.post("/cancel", data={"task_id": leased}, headers={"origin": SITE})
        assert r.headers["location"] == f"/tasks/{leased}?cancel=requested"
        task = q.get(leased)
        assert (task.state, task.cancel_reason) == ("leased", "cancelled from the dashboard")

        r = await c.post("/cancel", data={"task_id": done}, headers={"origin": SITE})
        assert r.headers["location"] == f"/tasks/{done}?cancel=finished"
        assert q.get(done).state == "done"

        r = await c.post("/cancel", data={}, headers={"origin": SITE})
        assert r.status_code == 400
        r = await c.post("/cancel", data={"task_id": "no-such"}, headers={"origin": SITE})
        assert r.status_code == 404
        r = await c.post(
            "/cancel", data={"task_id": done, "reason": "two\nlines"}, headers={"origin": SITE}
        )
        assert r.status_code == 400


async def test_task_lists_page_through_every_state(store) -> None:
    from agentlease.dashboard._app import LIST_LIMIT

    q = store.queue()
    ids = [e.task_id for e in q.enqueue_many(Q, list(range(LIST_LIMIT + 5)))]
    cancelled = q.enqueue(Q, "stop").task_id
    q.cancel(cancelled, "not needed")
    async with client(lambda: create_app(queue=store.aqueue)) as c:
        page = await c.get(f"/queues/{Q}")
        for state in ("queued", "leased", "done", "dead", "cancelled"):
            assert f'href="/queues/{Q}/tasks?state={state}"' in page.text

        page = await c.get(f"/queues/{Q}/tasks?state=queued")
        assert page.status_code == 200
        shown = re.findall(r'<tr data-task="([^"]+)">', page.text)
        assert len(shown) == LIST_LIMIT
        nxt = re.search(r'<a href="([^"]+)" id="next-page">', page.text)
        assert nxt is not None
        page = await c.get(nxt.group(1).replace("&amp;", "&"))
        assert page.status_code == 200
        more = re.findall(r'<tr data-task="([^"]+)">', page.text)
        assert sorted(shown + more) == sorted(ids)
        assert 'id="last-page"' in page.text

        page = await c.get(f"/queues/{Q}/tasks?state=cancelled")
        assert re.findall(r'<tr data-task="([^"]+)">', page.text) == [cancelled]
        page = await c.get(f"/queues/{Q}/tasks?state=dead")
        assert 'id="no-tasks"' in page.text

        assert (await c.get(f"/queues/{Q}/tasks?state=bogus")).status_code == 400
        assert (await c.get(f"/queues/{Q}/tasks?state=queued&cursor=junk")).status_code == 400
        assert (await c.get("/queues/nope/tasks?state=queued")).status_code == 404
