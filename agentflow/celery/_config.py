"""The Celery settings agentflow relies on: the app-wide configuration, and each task's own options."""

from __future__ import annotations

from typing import Any

from agentflow._errors import RunFailed
from agentflow.celery._settings import WorkerSettings


def celery_config(
    redis_url: str, *, key_prefix: str = "agentflow", queue: str = "agentflow", visibility_timeout_s: int = 3600
) -> dict[str, Any]:
    """The Celery configuration of an app whose broker and result backend are one Redis.

    JSON only; late acks, a task whose worker is lost is rejected (so redelivered), one message
    prefetched at a time; task events on (Flower sees the tasks); every broker and result key
    under ``<key_prefix>:celery:``; unacknowledged messages swept back every 10 s and
    redelivered after `visibility_timeout_s` (keep it at least twice a task's time limit).

    Args:
        redis_url: the Redis of the broker and the result backend (may hold a password).
        key_prefix: the deployment's (or tenant's) key prefix.
        queue: the default queue.
        visibility_timeout_s: how long Redis waits before it redelivers an unacknowledged message.

    Returns:
        Settings for ``app.conf.update(...)``.
    """
    transport = {
        "visibility_timeout": visibility_timeout_s,
        "global_keyprefix": f"{key_prefix}:celery:",
        "socket_timeout": 30,
        "socket_connect_timeout": 5,
        "socket_keepalive": True,
        "health_check_interval": 25,
        "unacked_restore_interval": 10,
        "unacked_restore_throttle": 1,
    }
    return {
        "broker_url": redis_url,
        "result_backend": redis_url,
        "task_serializer": "json",
        "result_serializer": "json",
        "event_serializer": "json",
        "accept_content": ["json"],
        "result_accept_content": ["json"],
        "task_acks_late": True,
        "task_acks_on_failure": True,
        "task_acks_on_timeout": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        "worker_cancel_long_running_tasks_on_connection_loss": True,
        "broker_connection_retry_on_startup": True,
        "broker_transport_options": transport,
        "result_backend_transport_options": {"global_keyprefix": f"{key_prefix}:celery:"},
        "result_expires": 86400,
        "worker_send_task_events": True,
        "task_send_sent_event": True,
        "task_default_queue": queue,
        "timezone": "UTC",
        "beat_enable_remote_control": True,
    }


def task_options(settings: WorkerSettings) -> dict[str, Any]:
    return {
        "bind": True,
        "acks_late": True,
        "acks_on_failure": True,
        "acks_on_timeout": True,
        "reject_on_worker_lost": True,
        "retry_on_worker_lost": True,
        "time_limit": settings.time_limit_s,
        "soft_time_limit": settings.soft_time_limit_s,
        "max_retries": settings.max_retries,
        "default_retry_delay": 2,
        "serializer": "json",
        # A run that ended failed is an outcome, not a crash: logged at INFO, no traceback.
        "throws": (RunFailed,),
    }
