"""Wiring: settings -> Celery app -> agentflow tasks on it. No logic of its own."""

from __future__ import annotations

import redis.asyncio
from celery import Celery

from agentflow.celery import WorkerSettings, register_tasks
from agentflow.exec.checkpoints import RedisCheckpointStore
from config import load_settings
from workers.flows import app as flow_app

settings = load_settings()
_url = settings.redis_url.get_secret_value()

app = Celery("agentflow-workers")
app.conf.update(settings.celery())


def _redis() -> redis.asyncio.Redis:
    return redis.asyncio.Redis.from_url(_url)


tasks = register_tasks(
    app,
    flow_app,
    store_factory=lambda: RedisCheckpointStore(_redis, prefix=settings.key_prefix, ttl_s=settings.ttl_s),
    checkpoint_key=settings.keys(),
    redis_factory=_redis,
    prefix=settings.key_prefix,
    settings=WorkerSettings(
        lease_s=settings.lease_s,
        stale_after_s=settings.stale_after_s,
        recover_interval_s=settings.recover_interval_s,
        time_limit_s=settings.time_limit_s,
        soft_time_limit_s=settings.soft_time_limit_s,
        queue=settings.queue,
    ),
)
