"""Distributed mode: every superstep a Celery task on Redis (needs the ``celery`` extra).

The public surface is what an application wires and calls: `make_app` (your flows, agents
and `Settings` in, a Celery app and its tasks out: `agentflow.celery.app`), or
`register_tasks` (with `WorkerSettings` and `celery_config`) on a Celery app of your own, and
`FlowClient` to start, follow and resume runs. What a worker process keeps for itself (the run `Leases`, the
event-loop bridge) stays in the private modules; its `Worker` (`agentflow.celery.worker`) and
what a task sends next (`agentflow.celery.follow_ups`) are public modules but not part of
this surface: the simulation (`agentflow.sim`) drives them, an application does not.
"""

try:
    import celery as _celery  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("agentflow.celery needs the 'celery' extra: pip install 'agentflow[celery]'") from exc

from agentflow.celery._deployment import Settings, load_settings
from agentflow.celery._locate import load_tasks
from agentflow.celery._settings import WorkerSettings
from agentflow.celery._tasks import AgentflowTasks, celery_config, register_tasks
from agentflow.celery.app import Fleet, make_app
from agentflow.celery.client import FlowClient, RunView

__all__ = [
    "AgentflowTasks",
    "Fleet",
    "FlowClient",
    "RunView",
    "Settings",
    "WorkerSettings",
    "celery_config",
    "load_settings",
    "load_tasks",
    "make_app",
    "register_tasks",
]
