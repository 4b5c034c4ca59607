"""Wiring: settings -> Celery app -> agentflow tasks on it (imported without side effects).

The repository's deployment is a use of the package's factory (`agentflow.celery.make_app`)
with the app ``AGENTFLOW_APP`` names: the broker is `Settings.broker` (Redis or RabbitMQ),
the checkpoint store, leases included, `Settings.store`, with the deployment's key prefix
and TTL filling in what its URL leaves out (`agentflow.celery.app.store_url`).
A worker of this app consumes the queues ``-Q`` names (the deployment's, ``AGENTFLOW_QUEUE``),
and, whatever ``-Q`` says, the sweep queue (``AGENTFLOW_SWEEP_QUEUE``, ``<queue>.sweep`` unless
set: recover_all's messages) and the queue of each flow version it runs
(`agentflow.celery.register_tasks`).
"""

from __future__ import annotations

from celery import Celery

from agentflow.celery import AgentflowTasks, make_app
from agentflow.celery.app import store_factory, store_url
from config import Settings
from workers.flows import load_flow_app

__all__ = ["build", "store_factory", "store_url"]


def build(settings: Settings) -> tuple[Celery, AgentflowTasks]:
    """Make the Celery app of the app `settings` name and register agentflow's tasks on it."""
    celery_app, tasks = make_app(load_flow_app(settings.app), settings=settings)
    return celery_app, tasks
