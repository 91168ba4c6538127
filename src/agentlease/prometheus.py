"""A worker's metrics on a Prometheus endpoint (the ``prometheus`` extra:
``pip install agentlease[prometheus]``).

``agentlease worker --metrics-port PORT`` (or :func:`serve_metrics`) serves the metrics of
:mod:`agentlease.otel` (the same instruments that ``--otel`` pushes: counters, histograms and the
queue depth gauge) in the Prometheus text format on ``http://HOST:PORT/metrics``, through
OpenTelemetry's Prometheus exporter (``opentelemetry-exporter-prometheus``, on
``prometheus_client``): one set of instruments, scraped or pushed or both. Nothing here is
imported by ``import agentlease`` or by ``agentlease worker`` without ``--metrics-port``.

The exporter turns OpenTelemetry names into Prometheus ones: dots become underscores, counters
end in ``_total``, the histograms in seconds in ``_seconds`` (``_bucket``, ``_sum``,
``_count``), and attributes become labels the same way (``messaging.destination.name`` is
``messaging_destination_name``): ``agentlease_tasks_completed_total``,
``agentlease_task_run_time_seconds_bucket``, ``agentlease_queue_depth{agentlease_task_state=
"pending"}``, ... The endpoint also serves ``prometheus_client``'s process and Python collectors
and ``target_info`` (the OpenTelemetry resource: ``service_name``).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader
from prometheus_client import REGISTRY, make_wsgi_app

from agentlease import _validate as check

__all__ = ["MetricsServer", "serve_metrics"]


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes are not logged (one every few seconds)."""


class MetricsServer:
    """The HTTP server of ``/metrics`` (``prometheus_client``'s default registry), on a thread
    of its own. :meth:`close` stops it."""

    def __init__(self, host: str, port: int) -> None:
        """Listen on ``host``:``port`` (port 0: any free one; see :attr:`port`).

        Raises:
            OSError: the address cannot be listened on (a port in use, a host not of this
                machine).
        """
        server_class = _Server6 if ":" in host else _Server
        self._server = make_server(
            host, port, make_wsgi_app(REGISTRY), server_class, handler_class=_Quiet
        )
        self.host = host
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="agentlease-metrics", daemon=True
        )
        self._thread.start()

    @property
    def url(self) -> str:
        """``http://HOST:PORT/metrics``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        """Stop serving and release the port."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


def serve_metrics(
    host: str = "127.0.0.1",
    port: int = 9464,
    *,
    stats_interval: float = 15.0,
    otel: bool = False,
    service_name: str = "agentlease-worker",
) -> tuple[MetricsServer, Callable[[], None]]:
    """Instrument the process (:func:`agentlease.otel.instrument`) with a meter provider read by
    OpenTelemetry's Prometheus exporter, and serve it on ``http://host:port/metrics``.

    Args:
        host: the address to listen on (``127.0.0.1`` by default: this machine only).
        port: the port (0: any free one, see :attr:`MetricsServer.port`).
        stats_interval: seconds between two reads of a worker's queue stats for the depth
            gauge.
        otel: also push, as ``agentlease worker --otel`` does
            (:func:`agentlease.otel.instrument_from_env`): traces and the same metrics to the
            exporters the ``OTEL_*`` environment variables name.
        service_name: the resource's ``service.name`` unless ``OTEL_SERVICE_NAME`` or
            ``OTEL_RESOURCE_ATTRIBUTES`` name one.

    Raises:
        OSError: the address cannot be listened on (nothing is instrumented then).
        InvalidDuration: ``stats_interval`` is not a positive number of seconds.

    Returns:
        The server, and a function that stops it and the instrumentation (flushing what
        ``otel`` pushes).
    """
    check.duration(stats_interval, "stats_interval")
    server = MetricsServer(host, port)
    reader = PrometheusMetricReader()
    if otel:
        from agentlease.otel import instrument_from_env

        try:
            return server, _closing(
                server,
                instrument_from_env(
                    service_name=service_name,
                    stats_interval=stats_interval,
                    metric_readers=[reader],
                ),
            )
        except BaseException:
            server.close()
            reader.shutdown()
            raise
    from agentlease.otel import _resource, instrument

    readers: list[MetricReader] = [reader]
    provider = MeterProvider(resource=_resource(service_name), metric_readers=readers)
    installed = instrument(meter_provider=provider, stats_interval=stats_interval)

    def stop() -> None:
        installed.uninstrument()
        provider.shutdown()  # unregisters the reader's collector

    return server, _closing(server, stop)


def _closing(server: MetricsServer, stop: Callable[[], None]) -> Callable[[], None]:
    def close() -> None:
        try:
            stop()
        finally:
            server.close()

    return close
