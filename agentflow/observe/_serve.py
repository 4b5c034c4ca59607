"""Serving metrics over HTTP: prometheus-client's own server, on the loopback interface by default."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server

#: Where metrics are served unless told otherwise: nothing outside the host can scrape them.
DEFAULT_HOST = "127.0.0.1"


@dataclass
class MetricsServer:
    """A running metrics endpoint (``GET /metrics``); `close` stops it."""

    server: WSGIServer
    thread: threading.Thread

    @property
    def port(self) -> int:
        """The port it listens on (the one the OS chose, when asked for port 0)."""
        return int(self.server.server_port)

    def close(self) -> None:
        """Stop serving and release the port."""
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def serve_metrics(registry: CollectorRegistry, *, port: int, host: str = DEFAULT_HOST) -> MetricsServer:
    """Serve `registry` at ``http://host:port/metrics`` from a daemon thread of this process.

    Args:
        registry: what to serve (`Metrics.registry`, or a registry holding a
            `prometheus_client.multiprocess.MultiProcessCollector`).
        port: the port (0: any free one; `MetricsServer.port` says which).
        host: the address to bind; the loopback interface by default. Bind another only
            behind a network you trust: metrics name flows and tools.

    Raises:
        OSError: the address cannot be bound (in use, or not this host's).
    """
    server, thread = start_http_server(port, addr=host, registry=registry)
    return MetricsServer(server, thread)
