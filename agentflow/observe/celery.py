"""Metrics of Celery workers: every pool process counts, the worker's main process serves the sum.

Celery's prefork pool runs tasks in child processes that come and go (a child killed, or
replaced after its task limit), while Prometheus scrapes one address per worker. So the
workers use prometheus-client's multiprocess mode: each process writes its values to files
of its own in ``PROMETHEUS_MULTIPROC_DIR``, and the main process serves them summed
(`MultiProcessCollector`). A child that died leaves its files, so no count is lost with
it. The alternative, one exporter per process, would need a port per pool child and a
scrape target that changes with every restart of one.

prometheus-client chooses its mode once, when it is first imported, from the environment
(and ``celery`` itself imports it when Flower is installed), so ``PROMETHEUS_MULTIPROC_DIR``
must be set before the worker starts: an existing directory of this worker's own.
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery
from celery.signals import worker_init, worker_process_init, worker_shutdown
from prometheus_client import CollectorRegistry, values
from prometheus_client.multiprocess import MultiProcessCollector

from agentflow.celery import AgentflowTasks
from agentflow.observe._metrics import Metrics
from agentflow.observe._serve import DEFAULT_HOST, MetricsServer, serve_metrics

#: What the worker says when the multiprocess directory is missing.
NEEDS_DIR = (
    "AGENTFLOW_METRICS_PORT is set, so the worker serves metrics in prometheus-client's multiprocess mode: "
    "set PROMETHEUS_MULTIPROC_DIR, in the worker's environment before it starts, to an existing empty "
    "directory of this worker's own (e.g. PROMETHEUS_MULTIPROC_DIR=$(mktemp -d))"
)


def multiprocess_dir() -> str:
    """The directory the pool processes write their values to.

    Raises:
        SystemExit: it is not set, not a directory, or prometheus-client was imported before
            it was set (then this process is not in multiprocess mode).
    """
    path = os.environ.get("PROMETHEUS_MULTIPROC_DIR", "")
    if not path or not os.path.isdir(path):
        raise SystemExit(f"agentflow metrics: {NEEDS_DIR} (now: {path or 'not set'})")
    if not getattr(values.ValueClass, "_multiprocess", False):
        raise SystemExit(
            f"agentflow metrics: prometheus-client was imported before PROMETHEUS_MULTIPROC_DIR was set; {NEEDS_DIR}"
        )
    return path


def serve_worker_metrics(app: Celery, tasks: AgentflowTasks, *, port: int, host: str = DEFAULT_HOST) -> None:
    """Have each worker of `app` serve the metrics of all its processes at ``http://host:port/metrics``.

    When a worker's main process starts (Celery's ``worker_init``, before the pool forks):
    the metrics are defined and primed with the app's flows and tools, subscribed to the
    worker's event hub, and the worker's checkpoint store is timed; then the endpoint
    starts. Each pool process inherits all of it and counts into its own files. A worker
    that cannot serve (no multiprocess directory, the port taken) stops at start with a
    message saying why.
    """
    served: list[MetricsServer] = []

    def start(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is not app:
            return
        registry = CollectorRegistry()
        MultiProcessCollector(registry, multiprocess_dir())  # type: ignore[no-untyped-call]
        metrics = Metrics(register=False)
        metrics.prime(tasks.worker.flow_app)
        metrics.watch(tasks.worker.events)
        tasks.worker.hook_store(metrics.store_hook)
        try:
            served.append(serve_metrics(registry, port=port, host=host))
        except OSError as exc:
            raise SystemExit(f"agentflow metrics: cannot serve on {host}:{port}: {exc}") from None

    def close_in_child(**_: Any) -> None:
        for server in served:  # the pool process inherited the listening socket; only the main process serves
            server.server.socket.close()
        served.clear()

    def stop(sender: Any = None, **_: Any) -> None:
        while served:
            served.pop().close()

    worker_init.connect(start, weak=False)
    worker_process_init.connect(close_in_child, weak=False)
    worker_shutdown.connect(stop, weak=False)
