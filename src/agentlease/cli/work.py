"""The ``worker`` command: run a handler, given as ``MODULE:FUNCTION``, on one queue."""

from __future__ import annotations

import importlib
import logging
import os
import random
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import click

from agentlease._policy.retry import RetryPolicy
from agentlease._settings import QueueSettings
from agentlease._sync.queue import Queue
from agentlease._worker import Handler, Worker, WorkerSettings
from agentlease.backends import Backend, connect
from agentlease.cli._app import backend_option, cli, parse_age, reports_errors
from agentlease.errors import BackendUnavailable, WorkerError

__all__ = ["load_handler"]

log = logging.getLogger("agentlease.cli")


def load_handler(spec: str) -> Handler:
    """Import the handler named ``module.sub:function`` (the current directory is importable).

    The part after the colon may be dotted (``module:Class.method``).

    Raises:
        WorkerError: the spec is malformed, the module cannot be imported, or the name is
            missing or not callable.
    """
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute or ":" in attribute:
        raise WorkerError(
            f"handler must be MODULE:FUNCTION (e.g. myapp.tasks:handle), not {spec!r}"
        )
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        target: object = importlib.import_module(module_name)
    except Exception as exc:  # any failure while importing user code is the user's to see
        raise WorkerError(
            f"cannot import {module_name!r} for handler {spec!r}: {type(exc).__name__}: {exc}"
        ) from exc
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError as exc:
            raise WorkerError(f"{module_name!r} has no {attribute!r} (handler {spec!r})") from exc
    if not callable(target):
        raise WorkerError(f"handler {spec!r} is a {type(target).__name__}, not a function")
    handler: Handler = target  # the worker tells sync from async
    return handler


def _instrument(
    *, otel: bool, host: str, port: int | None, stats_interval: float
) -> Callable[[], None]:
    """Instrument the process for ``--otel`` and ``--metrics-port``; the function returned
    flushes the exporters and stops the metrics server."""
    if port is None:
        try:
            from agentlease.otel import instrument_from_env
        except ImportError as exc:
            raise WorkerError(
                f"--otel needs OpenTelemetry ({exc}); "
                "install it with: pip install 'agentlease[otel]'"
            ) from exc
        return instrument_from_env(stats_interval=stats_interval)
    try:
        from agentlease.prometheus import serve_metrics
    except ImportError as exc:
        raise WorkerError(
            f"--metrics-port needs the Prometheus exporter ({exc}); "
            "install it with: pip install 'agentlease[prometheus]'"
        ) from exc
    try:
        server, stop = serve_metrics(host, port, stats_interval=stats_interval, otel=otel)
    except OSError as exc:
        raise WorkerError(
            f"--metrics-port: cannot serve metrics on {host}:{port}: {exc.strerror or exc}"
        ) from exc
    log.info("metrics on %s", server.url)
    return stop


@contextmanager
def _logging(verbose: bool) -> Iterator[None]:
    """Log to stderr while the worker runs, one plain line per record: agentlease's events
    (every claim and completion too with ``verbose``) and whatever the handlers log at INFO and
    above."""
    root = logging.getLogger()
    ours = logging.getLogger("agentlease")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s", "%H:%M:%S")
    )
    saved = root.level, ours.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    ours.setLevel(logging.DEBUG if verbose else logging.INFO)
    try:
        yield
    finally:
        root.removeHandler(handler)
        root.setLevel(saved[0])
        ours.setLevel(saved[1])


def _connect_patiently(url: str, *, give_up_after: float | None) -> Backend:
    """Open the store, waiting for it while it is unreachable (a worker may start before its
    database): a warning now and then, jittered backoff, and with ``give_up_after`` the last
    error once that many seconds have passed. A refusal (bad password, ...) is raised at once."""
    started = time.monotonic()
    logged_at: float | None = None
    delay = 0.1
    while True:
        try:
            return connect(url)
        except BackendUnavailable as exc:
            now = time.monotonic()
            if give_up_after is not None and now - started >= give_up_after:
                raise
            if logged_at is None or now - logged_at >= 30.0:
                logged_at = now
                log.warning("store unreachable (%.1fs): %s; retrying", now - started, exc)
            time.sleep(random.uniform(0.0, delay))
            delay = min(5.0, delay * 2)


@cli.command()
@click.argument("handler_spec", metavar="MODULE:FUNCTION")
@backend_option
@click.option("--queue", "-q", "queue_name", required=True, help="The queue to work on.")
@click.option("--concurrency", "-c", type=int, default=1, show_default=True, help="Jobs at once.")
@click.option("--lease-for", type=float, default=30.0, show_default=True, help="Lease seconds.")
@click.option(
    "--prefetch",
    type=int,
    default=None,
    help="Tasks claimed ahead of a free slot while handlers are short (default: --concurrency).",
)
@click.option(
    "--no-batch",
    is_flag=True,
    help="One task per claim and one completion per write (no batching).",
)
@click.option(
    "--max-failures",
    type=int,
    default=3,
    show_default=True,
    help="Failures after which a task is dead-lettered (1: never retried).",
)
@click.option("--burst", is_flag=True, help="Exit once the queue is empty and jobs are done.")
@click.option(
    "--poll-interval", type=float, default=0.5, show_default=True, help="Longest idle wait."
)
@click.option(
    "--grace", type=float, default=30.0, show_default=True, help="Shutdown grace seconds."
)
@click.option(
    "--task-timeout",
    type=float,
    default=None,
    help="Seconds an attempt may run (tasks without a timeout of their own); then it fails.",
)
@click.option(
    "--max-lease",
    type=float,
    default=3600.0,
    show_default=True,
    help="The longest a lease may be held in all, however often it is extended.",
)
@click.option(
    "--progress-timeout",
    type=float,
    default=None,
    help="Seconds without progress after which a lease is no longer extended (default: none).",
)
@click.option(
    "--done-retention",
    default="7d",
    show_default=True,
    help="How long done tasks are kept, then purged (30s, 15m, 12h, 1d, 2w; at least 60s).",
)
@click.option(
    "--dead-retention", default="30d", show_default=True, help="How long dead letters are kept."
)
@click.option(
    "--purge-every",
    type=float,
    default=60.0,
    show_default=True,
    help="Seconds between this worker's purges (0: it purges nothing).",
)
@click.option("--verbose", "-v", is_flag=True, help="Also log every claim and completion.")
@click.option(
    "--otel",
    is_flag=True,
    help="Report metrics and traces through OpenTelemetry (the otel extra), configured by the "
    "OTEL_* environment variables.",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=None,
    help="Serve the metrics in the Prometheus text format on http://HOST:PORT/metrics "
    "(the prometheus extra).",
)
@click.option(
    "--metrics-host",
    default="127.0.0.1",
    show_default=True,
    help="The address --metrics-port listens on (0.0.0.0: every interface).",
)
@click.option(
    "--stats-interval",
    type=float,
    default=15.0,
    show_default=True,
    help="Seconds between two reads of the queue's stats for the depth gauge "
    "(--otel, --metrics-port).",
)
@reports_errors
def worker(
    handler_spec: str,
    url: str,
    queue_name: str,
    concurrency: int,
    lease_for: float,
    prefetch: int | None,
    no_batch: bool,
    max_failures: int,
    burst: bool,
    poll_interval: float,
    grace: float,
    task_timeout: float | None,
    max_lease: float,
    progress_timeout: float | None,
    done_retention: str,
    dead_retention: str,
    purge_every: float,
    verbose: bool,
    otel: bool,
    metrics_port: int | None,
    metrics_host: str,
    stats_interval: float,
) -> None:
    """Run MODULE:FUNCTION on the tasks of --queue until SIGTERM or SIGINT (or, with --burst,
    until the queue is empty).

    The handler takes a JobContext (an AsyncJobContext if it is async) and returns the task's
    JSON result. A first signal stops claiming and lets running jobs finish within --grace; then,
    or at a second signal, they are cancelled and the worker exits within about a second.
    Unfinished tasks go back to the front when their handler can run no more (never started,
    returned, or async and cancelled); a sync handler still running keeps its lease, which
    expires and is reaped as after a crash.

    --task-timeout limits each attempt (a task's own timeout, given at enqueue, comes first);
    --max-lease caps a lease however often it is extended; --progress-timeout stops extending a
    lease whose handler reports no progress for that long, so a stuck one is reaped.

    --otel reports spans and metrics through OpenTelemetry's global providers; with the
    OpenTelemetry SDK installed and no provider set, the OTEL_* environment variables configure
    them (OTEL_TRACES_EXPORTER, OTEL_METRICS_EXPORTER, OTEL_SERVICE_NAME, ...).
    --metrics-port serves the same metrics in the Prometheus text format on
    http://--metrics-host:--metrics-port/metrics (with or without --otel); a port in use ends
    the worker with status 2 before it claims anything.

    An unreachable store is logged and retried with backoff; a store that refuses the worker
    for good (authentication, permission, TLS, a missing or newer schema) ends it with status 2,
    and so does, with --burst, a store unreachable for a whole lease.

    Every --purge-every seconds the worker purges the queue's done tasks older than
    --done-retention and dead letters older than --dead-retention (their ids and dedup keys are
    free again), idempotency keys past their window and expired locks, budgets and breakers.
    """
    handler = load_handler(handler_spec)
    stop_otel = None
    if otel or metrics_port is not None:
        with _logging(verbose):
            stop_otel = _instrument(
                otel=otel, host=metrics_host, port=metrics_port, stats_interval=stats_interval
            )
    settings = WorkerSettings(
        concurrency=concurrency,
        batch=not no_batch,
        prefetch=prefetch,
        retry=RetryPolicy(max_failures=max_failures),
        poll_interval=poll_interval,
        shutdown_grace=grace,
        task_timeout=task_timeout,
        purge_every=purge_every or None,
    )
    queue_settings = QueueSettings(
        lease_for=lease_for,
        max_lease=max_lease,
        progress_timeout=progress_timeout,
        done_retention=parse_age(done_retention),
        dead_retention=parse_age(dead_retention),
    )
    with _logging(verbose):
        backend = _connect_patiently(url, give_up_after=lease_for if burst else None)
    queue = Queue(backend, settings=queue_settings)
    try:
        runner = Worker(queue, queue_name, handler, settings=settings)
        with _logging(verbose):
            log.info(
                "worker on %s queue %r: handler %s, concurrency %d, lease %gs%s",
                queue.backend.url,
                queue_name,
                handler_spec,
                concurrency,
                lease_for,
                ", burst" if burst else "",
            )
            processed = runner.run(burst=burst)
            log.info("worker stopped after %d jobs", processed)
    finally:
        queue.close()
        if stop_otel is not None:
            stop_otel()  # the last spans and metrics are exported before the exit
