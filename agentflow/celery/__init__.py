"""Distributed mode: every superstep a Celery task on Redis (needs the ``celery`` extra).

The public surface is what an application wires and calls: `register_tasks` (with
`WorkerSettings` and `celery_config`) on its own Celery app, and `FlowClient` to start,
follow and resume runs. What a worker process keeps for itself (the run `Leases`, the
event-loop bridge) stays in the private modules; its `Worker` (`agentflow.celery.worker`) and
what a task sends next (`agentflow.celery.follow_ups`) are public modules but not part of
this surface: the simulation (`agentflow.sim`) drives them, an application does not.
"""

try:
    import celery as _celery  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("agentflow.celery needs the 'celery' extra: pip install 'agentflow[celery]'") from exc

from agentflow.celery._locate import load_tasks
from agentflow.celery._settings import WorkerSettings
from agentflow.celery._tasks import AgentflowTasks, celery_config, register_tasks
from agentflow.celery.client import FlowClient, RunView

__all__ = ["AgentflowTasks", "FlowClient", "RunView", "WorkerSettings", "celery_config", "load_tasks", "register_tasks"]
