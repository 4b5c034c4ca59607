"""The Celery settings agentflow relies on: the app-wide configuration, and each task's own options.

`celery_config` picks the broker's half from the URL's scheme:

- Redis (``redis://``, ``rediss://``, ``redis+sentinel://``; any URL that is not AMQP): broker and result
  backend on that Redis, every key under ``<key_prefix>:celery:``. A ``redis+sentinel://`` URL
  (the store's form, `agentflow.exec.checkpoints.redis.urls`) becomes kombu's list of
  ``sentinel://`` URLs with the primary's name in the transport options: the workers ask the
  Sentinels for the primary and follow a failover without a restart. An unacknowledged
  message is redelivered once it has been unacknowledged for the visibility timeout
  (counted from delivery), so that timeout stays long and recovery comes from the run's lease instead.
- RabbitMQ (``amqp://``, ``amqps://``, ``pyamqp://``): every queue a quorum queue behind a
  topic exchange (the deployment's, and each flow version's queue, made as a missing
  queue: `_routing`), publisher confirms, and countdowns by native delayed delivery (the
  broker holds a recheck until it is due; a worker never holds it in memory). The broker
  requeues a message at once when the channel that took it closes, unacknowledged: there
  is no visibility timeout. A superstep under way when the connection drops is not
  cancelled: it saves to the store, and the lease keeps the requeued copy from acting.
  Results go to the result backend given, else nowhere: runs are read from the
  checkpoint store, and Flower follows tasks by their events.

Common to both: JSON only, late acks, prefetch multiplier 1, task events on, and a pool
process that died is given up on after 2 s (`worker_lost_wait`, Celery's default 10 s): its
task is then sent again (`task_options`), and a result it may still have sent is harmless,
since a second copy of a superstep finds the run held or moved on. A password is
written percent-encoded (``%2F`` for ``/``; kombu and Celery decode it, and the ``sentinel://``
URLs made here encode it again, every reserved character included); a user part holding a raw
``/``, ``?``, ``#`` or ``@`` is refused here, before kombu misreads it and quotes a piece of it.
"""

from __future__ import annotations

from typing import Any, Final
from urllib.parse import quote, urlsplit

from agentflow._errors import RunFailed
from agentflow._urls import check_user_part
from agentflow.celery._settings import WorkerSettings
from agentflow.exec.checkpoints.redis.urls import SENTINEL_SCHEME as SENTINEL
from agentflow.exec.checkpoints.redis.urls import parse_sentinel

#: Broker URL schemes of RabbitMQ (kombu's AMQP transports).
AMQP_SCHEMES: Final = ("amqp", "amqps", "pyamqp")
#: Broker URL schemes of Redis.
REDIS_SCHEMES: Final = ("redis", "rediss")
#: The scheme of a Redis primary found through Sentinel (see the module notes).
SENTINEL_SCHEME: Final = SENTINEL


def is_rabbitmq(broker_url: str) -> bool:
    """Whether `broker_url` names a RabbitMQ broker (an AMQP URL)."""
    return urlsplit(broker_url).scheme in AMQP_SCHEMES


def celery_config(
    broker_url: str,
    *,
    key_prefix: str = "agentflow",
    queue: str = "agentflow",
    visibility_timeout_s: int = 3600,
    result_backend: str | None = None,
) -> dict[str, Any]:
    """The Celery configuration of an app on a Redis or a RabbitMQ broker (see the module notes).

    Args:
        broker_url: the broker, ``redis://...`` or ``amqp://...`` (may hold a password).
        key_prefix: the deployment's (or tenant's) key prefix of the Redis broker and result keys.
        queue: the default queue.
        visibility_timeout_s: how long a Redis broker waits before it redelivers an
            unacknowledged message (keep it at least twice a task's time limit; RabbitMQ has none).
        result_backend: where Celery stores task results. Default: the broker itself on
            Redis; none on RabbitMQ (results are kept off the broker).

    Returns:
        Settings for ``app.conf.update(...)``.

    Raises:
        ValueError: a URL's user name or password is not percent-encoded (the message shows it redacted).
    """
    check_user_part(broker_url, "the broker URL")
    if result_backend is not None:
        check_user_part(result_backend, "the result backend URL")
    if is_rabbitmq(broker_url):
        broker = _rabbitmq(broker_url, key_prefix, result_backend)
    else:
        broker = _redis(broker_url, key_prefix, visibility_timeout_s, result_backend)
    return {
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
        "worker_lost_wait": 2.0,
        "worker_cancel_long_running_tasks_on_connection_loss": True,
        "broker_connection_retry_on_startup": True,
        "result_expires": 86400,
        "worker_send_task_events": True,
        "task_send_sent_event": True,
        "task_default_queue": queue,
        "timezone": "UTC",
        "beat_enable_remote_control": True,
        **broker,
    }


def _redis(url: str, key_prefix: str, visibility_timeout_s: int, result_backend: str | None) -> dict[str, Any]:
    """Broker and (by default) results on one Redis, under the key prefix; unacked messages swept every 10 s."""
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
    results: dict[str, Any] = {"global_keyprefix": f"{key_prefix}:celery:"}
    backend = result_backend or url
    sentinel = urlsplit(url).scheme == SENTINEL_SCHEME
    if sentinel:
        url, found = _kombu_sentinel(url)
        transport.update(found)
    if urlsplit(backend).scheme == SENTINEL_SCHEME:
        backend, found = _kombu_sentinel(backend)
        results.update(found)
    config = {
        "broker_url": url,
        "result_backend": backend,
        "broker_transport_options": transport,
        "result_backend_transport_options": results,
    }
    if sentinel:  # a worker that loses the primary with a message in hand reconnects (`_sentinel`)
        config["broker_transport"] = "agentflow.celery._sentinel:SentinelTransport"
    return config


def _kombu_sentinel(url: str) -> tuple[str, dict[str, Any]]:
    """A ``redis+sentinel://`` URL as kombu and Celery take it: ``sentinel://`` URLs and transport options."""
    found = parse_sentinel(url)
    auth = f"{quote(found.username or '', safe='')}:{quote(found.password, safe='')}@" if found.password else ""
    urls = ";".join(f"sentinel://{auth}{host}:{port}/{found.db}" for host, port in found.hosts)
    options: dict[str, Any] = {"master_name": found.service}
    if found.sentinel_password:
        options["sentinel_kwargs"] = {"password": found.sentinel_password}
    return urls, options


def _rabbitmq(url: str, key_prefix: str, result_backend: str | None) -> dict[str, Any]:
    """Quorum queues behind topic exchanges (native delayed delivery needs both), publisher confirms."""
    config: dict[str, Any] = {
        "broker_url": url,
        "result_backend": result_backend,
        # Every queue agentflow sends to or reads is declared alike (a second declaration with
        # other arguments is refused by the broker): the default queue, and each missing one.
        "task_default_queue_type": "quorum",
        "task_default_exchange_type": "topic",
        "task_create_missing_queue_type": "quorum",
        "task_create_missing_queue_exchange_type": "topic",
        "broker_native_delayed_delivery_queue_type": "quorum",
        "worker_detect_quorum_queues": True,
        # A send returns once the broker has the message (on a quorum queue: on a majority of nodes).
        "broker_transport_options": {"confirm_publish": True},
        # A superstep under way when the connection drops goes on to its save (the store is not
        # the broker); cancelling it would leave its call in doubt. Its message, requeued by the
        # broker at once, then finds the run held or moved on: the lease and the step keep a
        # second copy from acting. (On Redis the setting stays on, as it was.)
        "worker_cancel_long_running_tasks_on_connection_loss": False,
    }
    if result_backend is not None and urlsplit(result_backend).scheme in REDIS_SCHEMES:
        config["result_backend_transport_options"] = {"global_keyprefix": f"{key_prefix}:celery:"}
    return config


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
