"""The web dashboard: queues, live leases, dead letters, tasks, workers and hot partitions of a
store.

``agentlease dashboard --backend URL`` serves it (see :mod:`agentlease.cli.dashboard`);
:func:`create_app` makes the ASGI application, to mount in an application of your own.

Pages are rendered on the server (Starlette and Jinja2 with autoescaping: every name, payload
and error from the store is escaped) with a small inline style sheet and no script, and sent
with a content security policy that runs none, lets forms post only to the dashboard and no
other site frame it; the lists reload themselves every few seconds. Reading needs nothing. The
writes, requeueing dead letters and cancelling a task, need the dashboard to be started with a
token, and the request to carry it: either ``Authorization: Bearer TOKEN`` (scripts), or the
session cookie that the login form sets (HttpOnly, SameSite=Strict) on a request whose Origin
(or Referer) is the dashboard itself. Tokens are compared in constant time. A store that cannot
be reached gives a page with the error in a banner (HTTP 503), never a stack trace.

``/metrics`` serves each queue's tasks by state, leases, dead letters and live workers in the
Prometheus text format (:mod:`agentlease.dashboard._metrics`), from one read of the store per
few seconds however often it is scraped; read-only and without a token, like the pages, and
under the same host-name rule.

Needs the ``dashboard`` extra: ``pip install 'agentlease[dashboard]'``. Nothing else in
agentlease imports this package.
"""

from __future__ import annotations

try:
    import jinja2  # noqa: F401
    import starlette  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised in a subprocess by the tests
    raise ImportError(
        f"the dashboard needs its extra: pip install 'agentlease[dashboard]' ({exc})"
    ) from exc

from agentlease.dashboard._app import create_app

__all__ = ["create_app"]
