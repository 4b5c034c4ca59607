"""Observing runs: Prometheus metrics (the ``metrics`` extra) and OpenTelemetry traces (the ``otel`` extra).

`Metrics` keeps agentflow's counters, histograms and gauges from a runner's `Events`;
`serve_metrics` serves a registry over HTTP (127.0.0.1 by default); `Metrics.store_hook`
times a checkpoint store's operations (``ForwardingStore(store, [metrics.store_hook])``).
`agentflow.observe.celery.serve_worker_metrics` wires all of it into Celery workers
(prometheus-client's multiprocess mode; needs the ``celery`` extra too).

`Tracing` reports a run's spans to OpenTelemetry (``Executor(registry, tracer=Tracing())``),
one trace per run across every worker; `Tracing.store_hook` makes a store's operations
events of those spans, and `trace_worker` wires both into a Celery worker.

Each name is imported on first use and says which extra to install when its library is
missing. docs/observability.md says what each metric and span means.
"""

import typing

from agentflow import _optional

if typing.TYPE_CHECKING:
    from agentflow.observe._metrics import Metrics
    from agentflow.observe._serve import MetricsServer, serve_metrics
    from agentflow.observe._tracing import Tracing, trace_worker

__all__ = ["Metrics", "MetricsServer", "Tracing", "serve_metrics", "trace_worker"]

_OPTIONAL = {
    "Metrics": ("agentflow.observe._metrics", "metrics"),
    "MetricsServer": ("agentflow.observe._serve", "metrics"),
    "serve_metrics": ("agentflow.observe._serve", "metrics"),
    "Tracing": ("agentflow.observe._tracing", "otel"),
    "trace_worker": ("agentflow.observe._tracing", "otel"),
}

__getattr__ = _optional.lazy_attributes(__name__, _OPTIONAL)
