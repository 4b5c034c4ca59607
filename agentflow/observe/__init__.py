"""Observing runs: Prometheus metrics from the event hub (needs the ``metrics`` extra).

`Metrics` keeps agentflow's counters, histograms and gauges from a runner's `Events`;
`serve_metrics` serves a registry over HTTP (127.0.0.1 by default); `TimedStore` times a
checkpoint store's operations. `agentflow.observe.celery.serve_worker_metrics` wires all
of it into Celery workers (prometheus-client's multiprocess mode; needs the ``celery``
extra too). docs/observability.md says what each metric means.
"""

try:
    import prometheus_client as _prometheus_client  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("agentflow.observe needs the 'metrics' extra: pip install 'agentflow[metrics]'") from exc

from agentflow.observe._metrics import Metrics
from agentflow.observe._serve import MetricsServer, serve_metrics
from agentflow.observe._store import TimedStore

__all__ = ["Metrics", "MetricsServer", "TimedStore", "serve_metrics"]
