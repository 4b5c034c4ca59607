"""The demo's own Celery app, built from `agentflow.celery` alone (not from the repository's ``workers/``).

The distributed demo and the worker processes it starts build the same app from the same
environment: `redis_url` (``AGENTFLOW_REDIS_URL``) and `demo_prefix` (``AGENTFLOW_DEMO_PREFIX``).
Everything else is fixed here, for a story told in seconds. The key is the demo's public
`DEMO_KEY`: it protects nothing, and nothing outside the demo uses it.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Final

import redis.asyncio
from celery import Celery

from agentflow.celery import AgentflowTasks, WorkerSettings, celery_config, register_tasks
from agentflow.demo.tickets import app as tickets_app
from agentflow.demo.worker import DEMO_KEY
from agentflow.exec.checkpoints import RedisCheckpointStore

#: Names the demo's Redis key prefix (and queue); tests set it so they never touch a user's demo.
PREFIX_ENV: Final = "AGENTFLOW_DEMO_PREFIX"
DEFAULT_PREFIX: Final = "agentflow-demo"
#: A dead worker's lease lapses this soon, so recovery starts within seconds.
LEASE_S: Final = 3.0
#: The demo's worker settings: short leases, and time limits far above the demo's slow mail.
SETTINGS: Final = WorkerSettings(lease_s=LEASE_S, stale_after_s=1.0, time_limit_s=120, soft_time_limit_s=100)
#: Redis redelivers an unacknowledged message after this long (twice the time limit, at least).
VISIBILITY_TIMEOUT_S: Final = 600


def redis_url() -> str:
    """The Redis the demo uses (``AGENTFLOW_REDIS_URL``, default the local one)."""
    return os.environ.get("AGENTFLOW_REDIS_URL", "redis://127.0.0.1:6379/0")


def demo_prefix() -> str:
    """The demo's key prefix and queue name.

    Raises:
        SystemExit: the prefix in the environment could match other keys.
    """
    prefix = os.environ.get(PREFIX_ENV, DEFAULT_PREFIX)
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", prefix):
        raise SystemExit(f"{PREFIX_ENV}={prefix!r}: use letters, digits, '.', '_' or '-' only")
    return prefix


def build(url: str, prefix: str) -> tuple[Celery, AgentflowTasks]:
    """Make the demo's Celery app (the ticket flow on a Redis store under `prefix`) and register agentflow's tasks."""

    def connect() -> redis.asyncio.Redis:
        # No socket timeout: the store gives each command (leases included) a deadline of its own.
        return redis.asyncio.Redis.from_url(url, socket_timeout=None, socket_connect_timeout=5)

    app = Celery("agentflow-demo")
    app.conf.update(celery_config(url, key_prefix=prefix, queue=prefix, visibility_timeout_s=VISIBILITY_TIMEOUT_S))
    tasks = register_tasks(
        app,
        tickets_app,
        # The machine's Redis keeps nothing on disk: the demo's runs need not outlive it, said so.
        store_factory=lambda: RedisCheckpointStore(connect, prefix=prefix, allow_volatile=True),
        checkpoint_key=DEMO_KEY,
        settings=dataclasses.replace(SETTINGS, queue=prefix),
    )
    return app, tasks
