"""agentflow: durable execution for agent work (tool-call graphs and LLM tool loops)."""

from agentflow._app import FlowApp
from agentflow._errors import AgentflowError
from agentflow._events import Event, Events
from agentflow._identity import RunContext
from agentflow.exec import Executor, Registry
from agentflow.flow import Call, Flow, FlowRunner, RunResult, RunStatus

__all__ = [
    "AgentflowError",
    "Call",
    "Event",
    "Events",
    "Executor",
    "Flow",
    "FlowApp",
    "FlowRunner",
    "Registry",
    "RunContext",
    "RunResult",
    "RunStatus",
]
