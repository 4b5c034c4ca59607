"""Distributed mode: every superstep a Celery task on Redis (needs the ``celery`` extra)."""

try:
    import celery as _celery  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("agentflow.celery needs the 'celery' extra: pip install 'agentflow[celery]'") from exc

from agentflow.celery._bridge import LoopBridge
from agentflow.celery._lease import Leases
from agentflow.celery._tasks import AgentflowTasks, register_tasks
from agentflow.celery._worker import Outcome, Worker, WorkerSettings
from agentflow.celery.client import FlowClient, RunView

__all__ = [
    "AgentflowTasks",
    "FlowClient",
    "Leases",
    "LoopBridge",
    "Outcome",
    "RunView",
    "Worker",
    "WorkerSettings",
    "register_tasks",
]
