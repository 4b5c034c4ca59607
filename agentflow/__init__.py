"""agentflow: durable execution for agent work (tool-call graphs and LLM tool loops)."""

from agentflow._app import FlowApp, LoopSpec
from agentflow._events import Event, Events
from agentflow._identity import RunContext
from agentflow._run_types import RunKind, RunStatus
from agentflow.exec import Executor, Registry
from agentflow.exec.limits import Limit
from agentflow.exec.run.control import DidNotHappen, Happened, InDoubtDecision, Rerun
from agentflow.flow import Call, Child, Flow, FlowRunner, FlowVersions, Map, RunResult, Wait

__all__ = [
    "Call",
    "Child",
    "DidNotHappen",
    "Event",
    "Events",
    "Executor",
    "Flow",
    "FlowApp",
    "FlowRunner",
    "FlowVersions",
    "Happened",
    "InDoubtDecision",
    "Limit",
    "LoopSpec",
    "Map",
    "Registry",
    "Rerun",
    "RunContext",
    "RunKind",
    "RunResult",
    "RunStatus",
    "Wait",
]
