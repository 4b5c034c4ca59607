"""Flows: the graph builder, supersteps, and the runner with its durability."""

from agentflow._errors import FlowError
from agentflow._run_types import RunStatus
from agentflow.flow._graph import Call, Child, Flow, Map, Wait
from agentflow.flow._result import RunResult
from agentflow.flow._runner import FlowRunner
from agentflow.flow._superstep import NodeHandle
from agentflow.flow._versions import FlowVersions

__all__ = [
    "Call",
    "Child",
    "Flow",
    "FlowError",
    "FlowRunner",
    "FlowVersions",
    "Map",
    "NodeHandle",
    "RunResult",
    "RunStatus",
    "Wait",
]
