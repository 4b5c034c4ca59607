"""agentflow: durable execution for agent work (tool-call graphs and LLM tool loops)."""

from agentflow._app import FlowApp, LoopSpec
from agentflow._errors import (
    AgentflowError,
    ApprovalDenied,
    CheckpointConflict,
    CheckpointError,
    CheckpointNotFound,
    CheckpointStoreCorrupt,
    CheckpointTooLarge,
    ControlRefused,
    FlowError,
    IdentityMismatch,
    ModelError,
    RecoveryNeedsDecision,
    RunFailed,
    RunHeld,
    Stale,
    ToolArgumentsInvalid,
    ToolError,
    ToolTimeout,
    UnknownTool,
    VersionNotDeployed,
)
from agentflow._events import Event, Events
from agentflow._identity import RunContext
from agentflow._run_types import RunKind, RunStatus
from agentflow.exec import Executor, Registry
from agentflow.exec._run_control import DidNotHappen, Happened, InDoubtDecision, Rerun
from agentflow.exec.limits import Limit, RateLimited
from agentflow.flow import Call, Child, Flow, FlowRunner, FlowVersions, Map, RunResult, Wait

__all__ = [
    "AgentflowError",
    "ApprovalDenied",
    "Call",
    "Child",
    "CheckpointConflict",
    "CheckpointError",
    "CheckpointNotFound",
    "CheckpointStoreCorrupt",
    "CheckpointTooLarge",
    "ControlRefused",
    "DidNotHappen",
    "Event",
    "Events",
    "Executor",
    "Flow",
    "FlowApp",
    "FlowError",
    "FlowRunner",
    "FlowVersions",
    "Happened",
    "IdentityMismatch",
    "InDoubtDecision",
    "Limit",
    "LoopSpec",
    "Map",
    "ModelError",
    "RateLimited",
    "RecoveryNeedsDecision",
    "Registry",
    "Rerun",
    "RunContext",
    "RunFailed",
    "RunHeld",
    "RunKind",
    "RunResult",
    "RunStatus",
    "Stale",
    "ToolArgumentsInvalid",
    "ToolError",
    "ToolTimeout",
    "UnknownTool",
    "VersionNotDeployed",
    "Wait",
]
