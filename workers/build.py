"""Wiring: settings -> Celery app -> agentflow tasks on it (imported without side effects)."""

from __future__ import annotations

import redis.asyncio
from celery import Celery

from agentflow.celery import AgentflowTasks, WorkerSettings, register_tasks
from agentflow.exec.checkpoints import RedisCheckpointStore
from config import Settings
from workers.flows import load_flow_app


def build(settings: Settings) -> tuple[Celery, AgentflowTasks]:
    """Make the Celery app and register agentflow's tasks on it."""
    url = settings.redis_url.get_secret_value()

    def connect() -> redis.asyncio.Redis:
        # No socket timeout: the store gives each command (leases included) a deadline of its own.
        return redis.asyncio.Redis.from_url(url, socket_timeout=None, socket_connect_timeout=5)

    celery_app = Celery("agentflow-workers")
    celery_app.conf.update(settings.celery())
    registered = register_tasks(
        celery_app,
        load_flow_app(settings.app),
        store_factory=lambda: RedisCheckpointStore(connect, prefix=settings.key_prefix, ttl_s=settings.ttl_s),
        checkpoint_key=settings.keys(),
        settings=WorkerSettings(
            lease_s=settings.lease_s,
            stale_after_s=settings.stale_after_s,
            recover_lock_s=settings.recover_lock_s,
            recheck_margin_s=settings.recheck_margin_s,
            recover_interval_s=settings.recover_interval_s,
            sweep_forgotten=settings.recover_sweep,
            retention_days=settings.retention_days,
            retention_interval_s=settings.retention_interval_s,
            time_limit_s=settings.time_limit_s,
            soft_time_limit_s=settings.soft_time_limit_s,
            queue=settings.queue,
        ),
    )
    if settings.metrics_port:
        from agentflow.observe.celery import serve_worker_metrics  # the metrics extra, only when asked for

        serve_worker_metrics(celery_app, registered, port=settings.metrics_port, host=settings.metrics_host)
    if settings.tracing:
        from agentflow.observe import trace_worker  # the otel extra, only when asked for

        trace_worker(registered.worker)
    return celery_app, registered
