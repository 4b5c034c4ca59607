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
    RunHeld,
    Stale,
    ToolArgumentsInvalid,
    ToolError,
    ToolTimeout,
    UnknownTool,
)
from agentflow._events import Event, Events
from agentflow._identity import RunContext
from agentflow._run_types import RunKind, RunStatus
from agentflow.exec import Executor, Registry
from agentflow.flow import Call, Flow, FlowRunner, RunResult

__all__ = [
    "AgentflowError",
    "ApprovalDenied",
    "Call",
    "CheckpointConflict",
    "CheckpointError",
    "CheckpointNotFound",
    "CheckpointStoreCorrupt",
    "CheckpointTooLarge",
    "ControlRefused",
    "Event",
    "Events",
    "Executor",
    "Flow",
    "FlowApp",
    "FlowError",
    "FlowRunner",
    "IdentityMismatch",
    "LoopSpec",
    "ModelError",
    "RecoveryNeedsDecision",
    "Registry",
    "RunContext",
    "RunHeld",
    "RunKind",
    "RunResult",
    "RunStatus",
    "Stale",
    "ToolArgumentsInvalid",
    "ToolError",
    "ToolTimeout",
    "UnknownTool",
]
