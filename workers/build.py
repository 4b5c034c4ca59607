"""Wiring: settings -> Celery app -> agentflow tasks on it (imported without side effects).

The broker is `Settings.broker` (Redis or RabbitMQ: `agentflow.celery.celery_config`); the
checkpoint store, leases included, is `Settings.store`, opened by the same code as the
``agentflow`` command's ``--store`` (`agentflow.cli._stores.open_store`). The deployment's
key prefix and TTL fill in what the store URL leaves out: a Redis store's ``prefix`` and
``ttl_s``, a SQL store's ``table_prefix`` (``<key_prefix>_``). A worker of this app consumes
the queues ``-Q`` names (the deployment's, ``AGENTFLOW_QUEUE``), and, whatever ``-Q`` says,
the sweep queue (``AGENTFLOW_SWEEP_QUEUE``, ``<queue>.sweep`` unless set: recover_all's
messages) and the queue of each flow version it runs (`agentflow.celery.register_tasks`).
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import parse_qsl, urlencode, urlsplit

from celery import Celery

from agentflow.celery import AgentflowTasks, WorkerSettings, register_tasks
from agentflow.cli._stores import open_store
from agentflow.exec.checkpoints import CheckpointStore
from config import Settings
from workers.flows import load_flow_app


def store_url(settings: Settings) -> str:
    """The store URL with the deployment's prefix, durability options and (Redis) TTL wherever the URL names none."""
    url = settings.store()
    scheme, query = urlsplit(url).scheme, urlsplit(url).query
    given = dict(parse_qsl(query, keep_blank_values=True))
    volatile = {"allow_volatile": "1" if settings.store_allow_volatile else "0"}
    if scheme in ("redis", "rediss", "redis+sentinel"):
        defaults = {"prefix": settings.key_prefix, "ttl_s": str(settings.ttl_s), **volatile}
        defaults["wait_replicas"] = str(settings.store_wait_replicas)
        defaults["wait_fsync"] = "1" if settings.store_wait_fsync else "0"
        defaults["wait_timeout_s"] = str(settings.store_wait_timeout_s)
    elif scheme == "postgresql+asyncpg":
        defaults = {"table_prefix": f"{settings.key_prefix.lower().replace('-', '_')}_", **volatile}
    else:
        defaults = {"table_prefix": f"{settings.key_prefix.lower().replace('-', '_')}_"}
    missing = {k: v for k, v in defaults.items() if k not in given}
    if not missing:
        return url
    return f"{url}{'&' if query else '?'}{urlencode(missing)}"


def store_factory(settings: Settings) -> Callable[[], CheckpointStore]:
    """What makes each worker process's store (nothing connects until it is first used).

    Raises:
        SystemExit: the store URL is not one the store opener accepts (the message says why).
    """
    url = store_url(settings)
    try:
        open_store(url, must_exist=False)  # refuse a bad URL at start, not in the first task
    except ValueError as exc:
        raise SystemExit(f"AGENTFLOW_STORE_URL: {exc}") from None
    return lambda: open_store(url, must_exist=False)


def build(settings: Settings) -> tuple[Celery, AgentflowTasks]:
    """Make the Celery app and register agentflow's tasks on it."""
    celery_app = Celery("agentflow-workers")
    celery_app.conf.update(settings.celery())
    registered = register_tasks(
        celery_app,
        load_flow_app(settings.app),
        store_factory=store_factory(settings),
        checkpoint_key=settings.keys(),
        settings=WorkerSettings(
            lease_s=settings.lease_s,
            stale_after_s=settings.stale_after_s,
            recover_lock_s=settings.recover_lock_s,
            recheck_margin_s=settings.recheck_margin_s,
            store_retries=settings.store_retries,
            store_retry_s=settings.store_retry_s,
            recover_interval_s=settings.recover_interval_s,
            sweep_forgotten=settings.recover_sweep,
            retention_days=settings.retention_days,
            retention_trim_days=settings.retention_trim_days,
            retention_interval_s=settings.retention_interval_s,
            time_limit_s=settings.time_limit_s,
            soft_time_limit_s=settings.soft_time_limit_s,
            queue=settings.queue,
            sweep_queue=settings.sweep_queue,
        ),
    )
    if settings.metrics_port:
        from agentflow.observe.celery import serve_worker_metrics  # the metrics extra, only when asked for

        serve_worker_metrics(celery_app, registered, port=settings.metrics_port, host=settings.metrics_host)
    if settings.tracing:
        from agentflow.observe import trace_worker  # the otel extra, only when asked for

        trace_worker(registered.worker)
    return celery_app, registered
