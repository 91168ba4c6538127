"""The dashboard's ASGI application: routes, the store it reads, and who may write.

Pages: the queues (``/``), one queue (``/queues/{queue}``: its counts, live leases with their
holders and a mark on those asked to cancel, dead letters), a queue's tasks in one state, page
by page through the state's index (``/queues/{queue}/tasks?state=&cursor=``), one task
(``/tasks/{id}``: its fields, attempt history, payload and the rest) and the live workers
(``/workers``, one of them at ``/workers/{id}``). Writes (requeue dead letters, cancel a task
that has not finished) need the token and a request from the dashboard itself.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import parse_qs, quote, urlencode, urlsplit

import jinja2
import orjson
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from agentlease._async.queue import AsyncQueue
from agentlease._codec import JSON
from agentlease._records import (
    LISTED,
    STATES,
    Attempt,
    LeaseInfo,
    QueueStats,
    Task,
    WorkerInfo,
)
from agentlease._redact import redact_url
from agentlease.dashboard._metrics import CONTENT_TYPE, MetricsCache
from agentlease.dashboard._rates import MEASURED, Rate, RateMeter
from agentlease.errors import (
    AgentLeaseError,
    BackendUnavailable,
    InvalidInput,
    NotFound,
)

__all__ = ["COOKIE", "HEADERS", "create_app"]

COOKIE = "agentlease_dashboard"  # the session cookie the login form sets
MAX_FORM = 64 * 1024  # bytes of a form body read at most
LIST_LIMIT = 100  # leases and dead letters listed per queue, tasks per page of a state
FINISHED = ("done", "dead", "cancelled")  # states a task does not leave (no cancel offered)
CANCEL_REASON = "cancelled from the dashboard"
ERROR_WIDTH = 300  # characters of an error shown in the dead-letter list
_SESSION = b"agentlease dashboard session v1"
# Every page: no script runs (whatever a payload holds), forms post only here, no other site
# frames it, and nothing of it is cached.
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}

_templates = jinja2.Environment(
    loader=jinja2.PackageLoader("agentlease.dashboard", "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)

QueueFactory = Callable[[], AsyncQueue]


class _Store:
    """The queue client, opened on first use and again after a failed open."""

    def __init__(self, factory: QueueFactory, where: str) -> None:
        self._factory = factory
        self._queue: AsyncQueue | None = None
        self.where = where

    def get(self) -> AsyncQueue:
        if self._queue is None:
            self._queue = self._factory()
        return self._queue

    async def close(self) -> None:
        if self._queue is not None:
            queue, self._queue = self._queue, None
            await queue.close()


def _session_value(token: str) -> str:
    """The cookie value that proves a login: derived from the token, so it is not the token."""
    return hmac.new(token.encode(), _SESSION, hashlib.sha256).hexdigest()


def _same(given: str | None, expected: str) -> bool:
    if given is None:
        return False
    return hmac.compare_digest(given.encode(), expected.encode())


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}s"


def _when(at: float | None, now: float) -> str:
    if at is None:
        return "-"
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(at))
    ago = now - at
    return f"{stamp} UTC ({ago:.1f}s ago)" if ago >= 0 else f"{stamp} UTC (in {-ago:.1f}s)"


def _json(value: JSON) -> str:
    return orjson.dumps(value, option=orjson.OPT_INDENT_2).decode()


def _describe(error: JSON) -> str:
    if isinstance(error, dict) and "type" in error and "message" in error:
        return f"{error['type']}: {error['message']}"
    return orjson.dumps(error).decode()


def _rate_cells(rate: Rate | None) -> dict[str, str]:
    cells = {}
    for state in MEASURED:
        value = None if rate is None else rate.per_minute.get(state)
        cells[state] = "-" if value is None else f"{value:.1f}"
    cells["span"] = "-" if rate is None else f"{rate.span:.0f}s"
    return cells


def _stats_row(s: QueueStats, rate: Rate | None) -> dict[str, Any]:
    return {
        "queue": s.queue,
        "counts": [(state, s.counts.get(state, 0)) for state in STATES],
        "depth": s.depth,
        "oldest": _seconds(s.oldest_queued_age),
        "rates": _rate_cells(rate),
        "hot": list(s.hot_partitions),
    }


def _lease_row(info: LeaseInfo, cancel_reason: str | None) -> dict[str, Any]:
    return {
        "task_id": info.task_id,
        "holder": info.holder or None,
        "cancel": cancel_reason,
        "attempt": info.attempt,
        "held": _seconds(info.leased_for),
        "left": _seconds(info.expires_in),
        "reclaims": info.reclaims,
        "failures": info.failures,
    }


def _dead_row(task: Task, now: float) -> dict[str, Any]:
    error = _describe(task.error)
    if len(error) > ERROR_WIDTH:
        error = error[: ERROR_WIDTH - 1] + "…"
    return {
        "id": task.id,
        "failures": task.failures,
        "reclaims": task.reclaims,
        "dead_for": _seconds(None if task.finished_at is None else now - task.finished_at),
        "error": error,
    }


def _task_row(task: Task, now: float) -> dict[str, Any]:
    error = "" if task.error is None else _describe(task.error)
    if len(error) > ERROR_WIDTH:
        error = error[: ERROR_WIDTH - 1] + "…"
    return {
        "id": task.id,
        "state": task.state,
        "priority": task.priority,
        "attempt": task.attempt,
        "created": _when(task.created_at, now),
        "finished": _when(task.finished_at, now),
        "cancel": task.cancel_reason,
        "error": error,
    }


def _attempt_row(a: Attempt, now: float) -> dict[str, Any]:
    ran = (now if a.ended is None else a.ended) - a.started
    return {
        "attempt": a.attempt,
        "worker": a.worker,
        "started": _when(a.started, now),
        "ended": "running" if a.ended is None else _when(a.ended, now),
        "ran": _seconds(max(0.0, ran)),
        "outcome": a.outcome or "running",
        "error": a.error or "-",
    }


def _worker_row(w: WorkerInfo, now: float) -> dict[str, Any]:
    return {
        "id": w.id,
        "where": f"{w.host or '?'}:{w.pid or '?'}",
        "queues": w.queues,
        "concurrency": w.concurrency,
        # The worker's own clock: only its wall time is known for the start.
        "started": _when(w.started, time.time()),
        "beat": _when(w.beat_at, now),
        "left": _seconds(w.expires_at - now),
        "tasks": w.tasks,
    }


def _task_fields(task: Task, now: float) -> list[tuple[str, str]]:
    error = task.error
    fields = [
        ("queue", task.queue),
        ("state", task.state),
        ("attempt", f"{task.attempt} ({task.failures} failed, {task.reclaims} reclaimed)"),
        ("priority", str(task.priority)),
        ("partition", task.partition or "-"),
        ("dedup key", task.dedup_key or "-"),
        ("root task", task.root_id),
        ("deadline", _when(task.deadline, now)),
        ("created", _when(task.created_at, now)),
        ("runs from", _when(task.run_at, now)),
        ("leased", _when(task.leased_at, now)),
        ("lease ends", _when(task.expires_at, now)),
        ("finished", _when(task.finished_at, now)),
    ]
    if task.cancel_reason is not None:
        fields.append(("cancel requested", task.cancel_reason))
    if isinstance(error, dict):
        fields.append(("error", f"{error.get('type')}: {error.get('message')}"))
        if error.get("reason"):
            fields.append(("reason", str(error["reason"])))
    elif error is not None:
        fields.append(("error", _json(error)))
    return fields


_CANCEL_NOTICES = {
    "cancelled": "cancelled",
    "requested": "cancel requested: its worker stops it at its next heartbeat",
    "finished": "not cancelled: the task had already finished",
}


def _root(request: Request) -> str:
    """The path the dashboard is mounted at ("" at the root of its site): links start with it."""
    root: str = request.scope.get("root_path", "")
    return root.rstrip("/")


def _local_path(value: str | None) -> str:
    """``value`` if it is a path on this site (never another site's URL), else ``/``."""
    if value and value.startswith("/") and not value.startswith("//") and "\\" not in value:
        return value
    return "/"


def create_app(
    url: str | None = None,
    *,
    queue: QueueFactory | None = None,
    token: str | None = None,
    refresh: int = 5,
    allowed_hosts: Sequence[str] | None = None,
    metrics_interval: float = 5.0,
) -> Starlette:
    """The dashboard as an ASGI application.

    Args:
        url: the store's URL (opened on the first request, and again after a failed open).
        queue: instead of ``url``, a function that opens the :class:`~agentlease.AsyncQueue`
            to show (called on the first request, in the application's event loop).
        token: the token every write must carry; ``None`` makes the dashboard read-only.
        refresh: seconds between reloads of the list pages (0: never).
        allowed_hosts: the host names requests may be addressed to (``Host`` header), which
            keeps a page served under another name (DNS rebinding) from reading the dashboard;
            ``None`` allows any.
        metrics_interval: seconds ``/metrics`` (the Prometheus text format, read-only, no
            token needed) keeps its read of the store, however often it is scraped.

    Raises:
        InvalidInput: neither or both of ``url`` and ``queue``, an empty token, a negative
            refresh or a negative metrics interval.
    """
    if (url is None) == (queue is None):
        raise InvalidInput("give the dashboard a store: url or queue, not both")
    if token is not None and not token:
        raise InvalidInput("the dashboard's token must not be empty")
    if not isinstance(refresh, int) or refresh < 0:
        raise InvalidInput(f"refresh must be a whole number of seconds >= 0, not {refresh!r}")
    if url is not None:
        store = _Store(lambda: _open(url), redact_url(url))
    else:
        assert queue is not None
        store = _Store(queue, "")
    if (
        isinstance(metrics_interval, bool)
        or not isinstance(metrics_interval, int | float)
        or not metrics_interval >= 0
    ):
        raise InvalidInput(f"metrics_interval must be seconds >= 0, not {metrics_interval!r}")
    session = None if token is None else _session_value(token)
    meter = RateMeter()
    scraped = MetricsCache(float(metrics_interval))

    def render(request: Request, template: str, status: int = 200, **context: Any) -> HTMLResponse:
        values: dict[str, Any] = {"refresh": 0, "error": None, "notice": None}
        values["root"] = root = _root(request)
        path = request.url.path
        values["here"] = _local_path(path[len(root) :] if path.startswith(root) else path)
        values.update(context)
        page = _templates.get_template(template).render(
            where=store.where, writable=token is not None, logged_in=_authorized(request), **values
        )
        return HTMLResponse(page, status_code=status, headers=HEADERS)

    def _authorized(request: Request) -> bool:
        if token is None:
            return False
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() == "bearer" and _same(given.strip(), token):
            return True
        assert session is not None
        return _same(request.cookies.get(COOKIE), session)

    def _cross_site(request: Request) -> bool:
        """A post from another site: its Origin (or Referer) is not this dashboard. A request
        naming neither is refused unless it carries the token in a header (no browser sends
        that to another site without asking first)."""
        origin = request.headers.get("origin")
        if origin is None and request.headers.get("referer"):
            parts = urlsplit(request.headers["referer"])
            origin = f"{parts.scheme}://{parts.netloc}"
        if origin is None:
            return not request.headers.get("authorization", "").lower().startswith("bearer ")
        own = f"{request.url.scheme}://{request.url.netloc}"
        return origin.rstrip("/").lower() != own.lower()

    async def _form(request: Request) -> dict[str, list[str]]:
        kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if kind != "application/x-www-form-urlencoded":
            return {}
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_FORM:
                raise InvalidInput(f"form over {MAX_FORM} bytes")
        return parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)

    def refuse(request: Request, why: str) -> HTMLResponse:
        return render(request, "error.html", status=403, title="refused", error=why)

    def guarded(
        handler: Callable[[Request], Awaitable[Response]],
    ) -> Callable[[Request], Awaitable[Response]]:
        """Turn the store's errors into a page with a banner, never a stack trace."""

        async def page(request: Request) -> Response:
            try:
                return await handler(request)
            except NotFound as exc:
                return render(request, "error.html", status=404, title="not found", error=exc)
            except InvalidInput as exc:
                return render(request, "error.html", status=400, title="refused", error=exc)
            except AgentLeaseError as exc:
                # Opened again on the next request: the store may be back by then.
                await store.close()
                error = f"the store cannot be read: {exc or type(exc).__name__}"
                return render(request, "error.html", status=503, title="store down", error=error)

        return page

    @guarded
    async def queues_page(request: Request) -> Response:
        q = store.get()
        rows = []
        for name in await q.queues():
            s = await q.stats(name)
            rows.append(_stats_row(s, meter.observe(name, s.now, s.counts)))
        return render(
            request, "queues.html", title="queues", rows=rows, states=STATES, refresh=refresh
        )

    @guarded
    async def queue_page(request: Request) -> Response:
        name = request.path_params["queue"]
        q = store.get()
        s = await q.stats(name)
        rate = meter.observe(name, s.now, s.counts)
        infos = await q.inspect(name, limit=LIST_LIMIT)
        # The cancel marks: the leased tasks, read through their index in the same order.
        held, _ = await q.tasks(name, state="leased", limit=LIST_LIMIT)
        asked = {t.id: t.cancel_reason for t in held}
        leases = [_lease_row(info, asked.get(info.task_id)) for info in infos]
        now = await q.backend.now()
        dead = [_dead_row(t, now) for t in await q.dead(name, limit=LIST_LIMIT)]
        requeued = request.query_params.get("requeued")
        notice = None
        if requeued is not None and requeued.isdigit():
            notice = f"requeued {int(requeued)} dead tasks"
        return render(
            request,
            "queue.html",
            title=f"queue {name}",
            queue=name,
            row=_stats_row(s, rate),
            states=STATES,
            leases=leases,
            dead=dead,
            listed=LISTED,
            limit=LIST_LIMIT,
            refresh=refresh,
            notice=notice,
        )

    @guarded
    async def task_page(request: Request) -> Response:
        q = store.get()
        task = await q.get(request.path_params["task_id"])
        now = await q.backend.now()
        blocks = [
            (name, _json(value))
            for name, value in (
                ("payload", task.payload),
                ("progress", task.progress),
                ("checkpoint", task.checkpoint),
                ("result", task.result),
            )
            if name == "payload" or value is not None
        ]
        error = task.error
        traceback = error.get("traceback") if isinstance(error, dict) else None
        outcome = request.query_params.get("cancel")
        notice = _CANCEL_NOTICES.get(outcome or "")
        return render(
            request,
            "task.html",
            title=f"task {task.id}",
            task=task,
            fields=_task_fields(task, now),
            attempts=[_attempt_row(a, now) for a in task.attempts],
            cancellable=task.state not in FINISHED,
            blocks=blocks,
            traceback=traceback if isinstance(traceback, str) else None,
            notice=notice,
        )

    @guarded
    async def tasks_page(request: Request) -> Response:
        name = request.path_params["queue"]
        state = request.query_params.get("state", "queued")
        cursor = request.query_params.get("cursor") or None
        q = store.get()
        await q.stats(name)  # an unknown queue is a 404, not an empty list
        listed = await q.tasks(name, state=state, limit=LIST_LIMIT, cursor=cursor)  # type: ignore[arg-type]  # tasks() checks it
        page, after = listed
        now = await q.backend.now()
        nxt = None
        if after is not None:
            query = urlencode({"state": state, "cursor": after})
            nxt = f"{_root(request)}/queues/{name}/tasks?{query}"
        return render(
            request,
            "tasks.html",
            title=f"{state} tasks of {name}",
            queue=name,
            state=state,
            listed=LISTED,
            tasks=[_task_row(t, now) for t in page],
            first=cursor is None,
            next=nxt,
            limit=LIST_LIMIT,
        )

    @guarded
    async def workers_page(request: Request) -> Response:
        q = store.get()
        listed = await q.workers()
        now = await q.backend.now()
        wanted = request.path_params.get("worker_id")
        if wanted is not None:
            listed = [w for w in listed if w.id == wanted]
            if not listed:
                raise NotFound(f"no live worker with id {wanted!r} (its entry may have lapsed)")
        return render(
            request,
            "workers.html",
            title="workers" if wanted is None else f"worker {wanted}",
            workers=[_worker_row(w, now) for w in listed],
            one=wanted is not None,
            refresh=refresh,
        )

    @guarded
    async def cancel(request: Request) -> Response:
        if token is None:
            return refuse(request, "this dashboard is read-only: start it with --token to write")
        if _cross_site(request):
            return refuse(request, "refused a write from another site")
        if not _authorized(request):
            return refuse(request, "log in with the dashboard's token to cancel")
        form = await _form(request)
        task_id = next(iter(form.get("task_id", [])), "")
        if not task_id:
            raise InvalidInput("name the task to cancel")
        reason = next(iter(form.get("reason", [])), "").strip() or CANCEL_REASON
        done = await store.get().cancel(task_id, reason)
        where = f"{_root(request)}/tasks/{quote(done.task_id, safe='/')}"
        return RedirectResponse(f"{where}?{urlencode({'cancel': done.outcome})}", status_code=303)

    @guarded
    async def requeue(request: Request) -> Response:
        if token is None:
            return refuse(request, "this dashboard is read-only: start it with --token to write")
        if _cross_site(request):
            return refuse(request, "refused a write from another site")
        if not _authorized(request):
            return refuse(request, "log in with the dashboard's token to requeue")
        name = request.path_params["queue"]
        form = await _form(request)
        ids = [i for i in form.get("task_id", []) if i]
        if not ids and form.get("all") != ["1"]:
            raise InvalidInput("name the dead tasks to requeue, or all of them")
        front = form.get("front") == ["1"]
        count = await store.get().requeue_dead(name, ids or None, front=front)
        where = f"{_root(request)}/queues/{name}?{urlencode({'requeued': count})}"
        return RedirectResponse(where, status_code=303)

    async def login_page(request: Request) -> Response:
        nxt = _local_path(request.query_params.get("next"))
        if token is None:
            return refuse(request, "this dashboard is read-only: it was started without a token")
        return render(request, "login.html", title="log in", next=nxt, wrong=False)

    async def login(request: Request) -> Response:
        if token is None:
            return refuse(request, "this dashboard is read-only: it was started without a token")
        if _cross_site(request):
            return refuse(request, "refused a log-in from another site")
        try:
            form = await _form(request)
        except InvalidInput as exc:
            return render(request, "error.html", status=400, title="refused", error=exc)
        nxt = _local_path(next(iter(form.get("next", [])), None))
        given = next(iter(form.get("token", [])), None)
        if not _same(given, token):
            return render(request, "login.html", status=403, title="log in", next=nxt, wrong=True)
        assert session is not None
        response = RedirectResponse(_root(request) + nxt, status_code=303)
        response.set_cookie(COOKIE, session, httponly=True, samesite="strict", path="/")
        return response

    async def logout(request: Request) -> Response:
        if _cross_site(request):
            return refuse(request, "refused a log-out from another site")
        response = RedirectResponse(_root(request) + "/", status_code=303)
        response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
        return response

    async def metrics(request: Request) -> Response:
        """The store's queues for Prometheus (read-only: no token, like the pages)."""
        headers = {**HEADERS, "Content-Type": CONTENT_TYPE}
        try:
            text = await scraped.get(store.get())
        except AgentLeaseError as exc:
            await store.close()
            scraped.forget()
            error = f"# the store cannot be read: {exc or type(exc).__name__}\n"
            return PlainTextResponse(error, status_code=503, headers=headers)
        return PlainTextResponse(text, headers=headers)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await store.close()

    middleware = []
    if allowed_hosts is not None:
        middleware.append(Middleware(TrustedHostMiddleware, allowed_hosts=list(allowed_hosts)))
    return Starlette(
        routes=[
            Route("/", queues_page),
            Route("/queues/{queue}", queue_page),
            Route("/queues/{queue}/requeue", requeue, methods=["POST"]),
            Route("/queues/{queue}/tasks", tasks_page),
            Route("/tasks/{task_id:path}", task_page),
            Route("/cancel", cancel, methods=["POST"]),
            Route("/workers", workers_page),
            Route("/workers/{worker_id:path}", workers_page),
            Route("/login", login_page),
            Route("/login", login, methods=["POST"]),
            Route("/logout", logout, methods=["POST"]),
            Route("/metrics", metrics),
        ],
        middleware=middleware,
        lifespan=lifespan,
    )


def _open(url: str) -> AsyncQueue:
    """The queue client on ``url``; a SQLite file that does not exist is an error here (a
    dashboard pointed at a mistyped path must not create an empty database)."""
    from agentlease.backends import connect_async
    from agentlease.cli.admin import _missing_sqlite_file

    missing = _missing_sqlite_file(url)
    if missing is not None:
        raise BackendUnavailable(f"no SQLite database at {missing!r} (from {redact_url(url)!r})")
    return AsyncQueue(connect_async(url))
